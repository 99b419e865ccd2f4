// A producer that is not Python: Kafka's own Java client sends JSON events to fleetlog.
//
//   java -cp 'infra/kafka/dist/lib/*' tests/service/java/JsonProducer.java BOOTSTRAP TOPIC HEADER < events
//
// Each line of standard input is one record value; HEADER is the content-type header to set
// ("application/json"), or "-" for none. Prints "OFFSET" for each record sent.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class JsonProducer {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "20000");
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isBlank()) {
                    continue;
                }
                ProducerRecord<byte[], byte[]> record =
                    new ProducerRecord<>(args[1], 0, null, line.getBytes(StandardCharsets.UTF_8));
                if (!args[2].equals("-")) {
                    record.headers().add("content-type", args[2].getBytes(StandardCharsets.UTF_8));
                }
                RecordMetadata sent = producer.send(record).get();
                System.out.println(sent.offset());
            }
        }
    }
}
