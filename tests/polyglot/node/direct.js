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
// Run by tests/tests/polyglot.rs; prints {"produced": N}. Each step is
// traced to stderr and bounded: a client that stalls (seen once on a loaded
// 2-core CI machine, with no output at all) makes the script name the step
// and exit instead of hanging until the test kills it. Exit code 3 means it
// stalled or failed before anything was sent, so a rerun cannot duplicate a
// job.
'use strict';
const { Kafka } = require('@confluentinc/kafka-javascript').KafkaJS;
const { SchemaRegistryClient, AvroSerializer, SerdeType } = require('@confluentinc/schemaregistry');

const t0 = Date.now();
let step = 'start';
let sent = false;
const trace = (s) => {
  step = s;
  console.error(`direct.js: ${s} (${Date.now() - t0} ms)`);
};
const STEP_BUDGET_MS = 90000;
const watchdog = setTimeout(() => {
  console.error(`direct.js: stuck in step "${step}" for over ${STEP_BUDGET_MS} ms in all; giving up`);
  process.exit(sent ? 1 : 3);
}, STEP_BUDGET_MS);

async function main() {
  const topic = process.env.KJOB_TEST_TOPIC;
  const first = Number(process.env.KJOB_TEST_SEQ);
  const count = Number(process.env.KJOB_TEST_COUNT);
  const registry = new SchemaRegistryClient({
    baseURLs: [process.env.KJOB_SCHEMA_REGISTRY_URL],
    // axios waits forever by default; a registry call gets 10 s.
    createAxiosDefaults: { timeout: 10000 },
  });
  // The route's contract is registered by kjob; use its latest version.
  const serializer = new AvroSerializer(registry, SerdeType.VALUE, { useLatestVersion: true });
  const producer = new Kafka().producer({
    'bootstrap.servers': process.env.KJOB_BOOTSTRAP_SERVERS,
    acks: -1,
    'enable.idempotence': true,
    'message.timeout.ms': 30000,
  });
  trace('connect');
  await producer.connect();
  trace('serialize');
  const messages = [];
  for (let seq = first; seq < first + count; seq++) {
    const key = `js-${seq % 5}`;
    const value = await serializer.serialize(topic, { key, seq, behaviour: 'ok' });
    // Half with kjob-id (the app's own id for the job), half with no header.
    const headers = seq < first + Math.floor(count / 2) ? { 'kjob-id': `node-${seq}` } : {};
    messages.push({ key, value, headers });
  }
  trace('send');
  sent = true;
  await producer.send({ topic, messages });
  trace('disconnect');
  await producer.disconnect();
  trace('done');
  clearTimeout(watchdog);
  console.log(JSON.stringify({ produced: count }));
}

main().catch((e) => {
  console.error(`direct.js: failed in step "${step}":`, e);
  process.exit(sent ? 1 : 3);
});
