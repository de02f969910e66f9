<?php
// Enqueue kjob jobs from PHP with PDO (pgsql), inside the app's transaction:
// what a Symfony or Laravel controller does with its Doctrine/Eloquent
// connection. Run by tests/tests/polyglot.rs; see tests/polyglot/README.md.

function env(string $name): string {
    $v = getenv($name);
    if ($v === false || $v === '') {
        fwrite(STDERR, "missing environment variable $name\n");
        exit(2);
    }
    return $v;
}

// postgres://user[:password]@host:port/db -> a PDO DSN.
$u = parse_url(env('KJOB_DATABASE_URL'));
$dsn = sprintf('pgsql:host=%s;port=%d;dbname=%s', $u['host'], $u['port'] ?? 5432, ltrim($u['path'], '/'));
$db = new PDO($dsn, $u['user'] ?? null, $u['pass'] ?? null, [PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION]);

$schema = env('KJOB_SQL_SCHEMA');
$topic = env('KJOB_TEST_TOPIC');
$orders = env('KJOB_APP_TABLE');
$seq = (int) env('KJOB_TEST_SEQ');

// A bad job carries its seq as a string: the contract says long.
function job(string $key, int $n, bool $bad = false): array {
    return ['key' => $key, 'seq' => $bad ? (string) $n : $n, 'behaviour' => 'ok'];
}

$enqueue = $db->prepare("SELECT $schema.enqueue(topic => :topic, key => :key, job => CAST(:job AS jsonb))");
$one = function (string $key, array $job) use ($enqueue, $topic): string {
    $enqueue->execute(['topic' => $topic, 'key' => $key, 'job' => json_encode($job)]);
    return $enqueue->fetchColumn();
};
$manyStmt = $db->prepare("SELECT array_to_json($schema.enqueue_many(:topic, CAST(:jobs AS jsonb)))");
$many = function (array $jobs) use ($manyStmt, $topic): array {
    $manyStmt->execute(['topic' => $topic, 'jobs' => json_encode($jobs)]);
    return json_decode($manyStmt->fetchColumn(), true);
};
$order = $db->prepare("INSERT INTO $orders (order_id, lang) VALUES (:id, 'php')");
$out = [];

// 1. Committed: the order and its jobs together.
$db->beginTransaction();
$order->execute(['id' => "o$seq"]);
$a = $one('php-a', job('php-a', $seq));
$b = $one('php-b', job('php-b', $seq + 1));
$m = $many([['key' => 'php-a', 'job' => job('php-a', $seq + 2)], ['key' => 'php-c', 'job' => job('php-c', $seq + 3)]]);
$db->commit();
$out['committed'] = array_merge([$a, $b], $m);

// 2. Rolled back: neither the order nor its jobs.
$db->beginTransaction();
$order->execute(['id' => 'o' . ($seq + 10)]);
$r = [$one('php-r', job('php-r', $seq + 10))];
$r = array_merge($r, $many([['key' => 'php-r', 'job' => job('php-r', $seq + 11)]]));
$db->rollBack();
$out['rolled_back'] = $r;

// 3. A job that does not fit the contract, then a good one of the same key.
$db->beginTransaction();
$out['bad'] = $one('php-bad', job('php-bad', $seq + 20, true));
$out['bad_follower'] = $one('php-bad', job('php-bad', $seq + 21));
$db->commit();

// 4. Delayed: runs no earlier than run_at.
$db->beginTransaction();
$d = $db->prepare("SELECT $schema.enqueue(topic => :topic, key => 'php-d', job => CAST(:job AS jsonb),
                                          run_at => now() + interval '2 seconds'),
                          (extract(epoch FROM now() + interval '2 seconds') * 1000)::bigint");
$d->execute(['topic' => $topic, 'job' => json_encode(job('php-d', $seq + 30))]);
[$out['delayed'], $runAt] = $d->fetch(PDO::FETCH_NUM);
$out['delayed_run_at_ms'] = (int) $runAt;
$db->commit();

// An insert-time check fails the statement (and so the transaction).
$db->beginTransaction();
try {
    $one('php-x', [1, 2]);
    $out['insert_error'] = null;
} catch (PDOException $e) {
    $out['insert_error'] = $e->getMessage();
}
$db->rollBack();

echo json_encode($out), "\n";
