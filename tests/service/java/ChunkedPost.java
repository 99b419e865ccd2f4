// A client that is not Python: Java 17's own HttpClient posts standard input to a URL. With a body
// publisher of unknown length (an InputStream) it sends the body chunked (Transfer-Encoding:
// chunked), as it does by default for streamed uploads.
//
//   java tests/service/java/ChunkedPost.java URL CONTENT_TYPE < body
//
// Prints the status code on the first line and the response body after it.
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;

public class ChunkedPost {
    public static void main(String[] args) throws Exception {
        HttpClient client = HttpClient.newBuilder()
            .version(HttpClient.Version.HTTP_1_1)
            .connectTimeout(Duration.ofSeconds(20))
            .build();
        HttpRequest request = HttpRequest.newBuilder(URI.create(args[0]))
            .timeout(Duration.ofSeconds(60))
            .header("Content-Type", args[1])
            .POST(HttpRequest.BodyPublishers.ofInputStream(() -> System.in))
            .build();
        HttpResponse<String> response = client.send(request, HttpResponse.BodyHandlers.ofString());
        System.out.println(response.statusCode());
        System.out.println(response.body());
    }
}
