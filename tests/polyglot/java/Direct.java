// Produce kjob jobs straight to Kafka from Java: kafka-clients with Apicurio's
// AvroKafkaSerializer configured for the Confluent wire format (magic byte,
// 4-byte schema id, Avro body; the id in the payload, not in headers).
//
// Why not Confluent's own KafkaAvroSerializer: io.confluent:kafka-avro-serializer
// is published only to Confluent's Maven repository, not to Maven Central. Where
// you can reach packages.confluent.io, it works the same way against kjob (set
// schema.registry.url to the registry's Confluent-compatible URL).
//
// What makes Apicurio's serializer write the Confluent format:
//   apicurio.registry.use-id=contentId        Apicurio's ccompat API hands out
//                                             content ids as schema ids
//   apicurio.registry.id-handler=Default4ByteIdHandler   4 bytes, not 8
//   apicurio.registry.headers.enabled=false   the id in the payload
//   apicurio.registry.find-latest=true        the subject <topic>-value kjob registered
//
// kjob headers are optional: without kjob-id, kjob derives the job's id from
// where the record entered the route (<topic>:<partition>:<offset>); without
// kjob-attempt it is attempt 1; without kjob-job/kjob-version the route's
// contract is assumed (the schema id in the frame is what decoding uses).
// For jobs tied to a database change, use kjob.enqueue (Enqueue.java).
//
// Run by tests/tests/polyglot.rs; prints {"produced": N}.

import java.nio.charset.StandardCharsets;
import java.util.Properties;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;

public class Direct {
    public static void main(String[] args) throws Exception {
        String topic = System.getenv("KJOB_TEST_TOPIC");
        long first = Long.parseLong(System.getenv("KJOB_TEST_SEQ"));
        int count = Integer.parseInt(System.getenv("KJOB_TEST_COUNT"));
        Schema schema = new Schema.Parser().parse(System.getenv("KJOB_SCHEMA"));
        // The native API of the same registry: .../apis/ccompat/v7 -> .../apis/registry/v3
        String registry = System.getenv("KJOB_SCHEMA_REGISTRY_URL").replaceAll("/apis/ccompat/v\\d+/?$", "/apis/registry/v3");

        Properties p = new Properties();
        p.put("bootstrap.servers", System.getenv("KJOB_BOOTSTRAP_SERVERS"));
        p.put("acks", "all");
        p.put("enable.idempotence", "true");
        p.put("key.serializer", "org.apache.kafka.common.serialization.StringSerializer");
        p.put("value.serializer", "io.apicurio.registry.serde.avro.AvroKafkaSerializer");
        p.put("apicurio.registry.url", registry);
        p.put("apicurio.registry.use-id", "contentId");
        p.put("apicurio.registry.id-handler", "io.apicurio.registry.serde.Default4ByteIdHandler");
        p.put("apicurio.registry.headers.enabled", "false");
        p.put("apicurio.registry.find-latest", "true");
        p.put("apicurio.registry.auto-register", "false");
        p.put("apicurio.registry.artifact.group-id", "default");

        try (KafkaProducer<String, GenericRecord> producer = new KafkaProducer<>(p)) {
            for (long seq = first; seq < first + count; seq++) {
                String key = "java-" + (seq % 5);
                GenericRecord job = new GenericData.Record(schema);
                job.put("key", key);
                job.put("seq", seq);
                job.put("behaviour", "ok");
                ProducerRecord<String, GenericRecord> r = new ProducerRecord<>(topic, key, job);
                // Half with kjob-id (the app's own id for the job), half with no header.
                if (seq < first + count / 2) {
                    r.headers().add("kjob-id", ("java-" + seq).getBytes(StandardCharsets.UTF_8));
                }
                producer.send(r).get();
            }
        }
        System.out.println("{\"produced\":" + count + "}");
    }
}
