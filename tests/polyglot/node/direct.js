// Produce kjob jobs straight to Kafka from Node: @confluentinc/kafka-javascript
// (its KafkaJS-style API) with @confluentinc/schemaregistry's AvroSerializer
// (Confluent wire format).
//
// kjob headers are optional: without kjob-id, kjob derives the job's id from
// where the record entered the route (<topic>:<partition>:<offset>); without
// kjob-attempt it is attempt 1; without kjob-job/kjob-version the route's
// contract is assumed (the schema id in the frame is what decoding uses).
// For jobs tied to a database change, use kjob.enqueue (enqueue.js).
//
// Run by tests/tests/polyglot.rs; prints {"produced": N}.
'use strict';
const { Kafka } = require('@confluentinc/kafka-javascript').KafkaJS;
const { SchemaRegistryClient, AvroSerializer, SerdeType } = require('@confluentinc/schemaregistry');

async function main() {
  const topic = process.env.KJOB_TEST_TOPIC;
  const first = Number(process.env.KJOB_TEST_SEQ);
  const count = Number(process.env.KJOB_TEST_COUNT);
  const registry = new SchemaRegistryClient({ baseURLs: [process.env.KJOB_SCHEMA_REGISTRY_URL] });
  // The route's contract is registered by kjob; use its latest version.
  const serializer = new AvroSerializer(registry, SerdeType.VALUE, { useLatestVersion: true });
  const producer = new Kafka().producer({
    'bootstrap.servers': process.env.KJOB_BOOTSTRAP_SERVERS,
    acks: -1,
    'enable.idempotence': true,
  });
  await producer.connect();
  const messages = [];
  for (let seq = first; seq < first + count; seq++) {
    const key = `js-${seq % 5}`;
    const value = await serializer.serialize(topic, { key, seq, behaviour: 'ok' });
    // Half with kjob-id (the app's own id for the job), half with no header.
    const headers = seq < first + Math.floor(count / 2) ? { 'kjob-id': `node-${seq}` } : {};
    messages.push({ key, value, headers });
  }
  await producer.send({ topic, messages });
  await producer.disconnect();
  console.log(JSON.stringify({ produced: count }));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
