// Enqueue kjob jobs from Java with JDBC, inside the app's transaction: what a
// Spring @Transactional service does with its DataSource. Run by
// tests/tests/polyglot.rs (`java -cp <postgresql jar> Enqueue.java`); see
// tests/polyglot/README.md for the protocol.

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.List;

public class Enqueue {
    static String env(String name) {
        String v = System.getenv(name);
        if (v == null || v.isEmpty()) throw new IllegalStateException("missing environment variable " + name);
        return v;
    }

    // A bad job carries its seq as a string: the contract says long.
    static String job(String key, long seq, boolean bad) {
        String n = bad ? "\"" + seq + "\"" : Long.toString(seq);
        return "{\"key\":\"" + key + "\",\"seq\":" + n + ",\"behaviour\":\"ok\"}";
    }

    static String schema, topic;

    static String one(Connection c, String key, String json) throws SQLException {
        try (PreparedStatement s = c.prepareStatement(
                "SELECT " + schema + ".enqueue(topic => ?, key => ?, job => ?::jsonb)")) {
            s.setString(1, topic);
            s.setString(2, key);
            s.setString(3, json);
            try (ResultSet r = s.executeQuery()) {
                r.next();
                return r.getString(1);
            }
        }
    }

    static List<String> many(Connection c, String jobsJson) throws SQLException {
        try (PreparedStatement s = c.prepareStatement("SELECT " + schema + ".enqueue_many(?, ?::jsonb)")) {
            s.setString(1, topic);
            s.setString(2, jobsJson);
            try (ResultSet r = s.executeQuery()) {
                r.next();
                List<String> ids = new ArrayList<>();
                for (Object id : (Object[]) r.getArray(1).getArray()) ids.add((String) id);
                return ids;
            }
        }
    }

    static void order(Connection c, String table, String id) throws SQLException {
        try (PreparedStatement s = c.prepareStatement("INSERT INTO " + table + " (order_id, lang) VALUES (?, 'java')")) {
            s.setString(1, id);
            s.executeUpdate();
        }
    }

    static String quoted(List<String> ids) {
        List<String> q = new ArrayList<>();
        for (String id : ids) q.add("\"" + id + "\"");
        return "[" + String.join(",", q) + "]";
    }

    public static void main(String[] args) throws Exception {
        // postgres://user@host:port/db -> jdbc:postgresql://host:port/db?user=user
        java.net.URI u = new java.net.URI(env("KJOB_DATABASE_URL"));
        String user = u.getUserInfo() == null ? "postgres" : u.getUserInfo().split(":", 2)[0];
        String jdbc = "jdbc:postgresql://" + u.getHost() + ":" + (u.getPort() < 0 ? 5432 : u.getPort()) + u.getPath();
        java.util.Properties props = new java.util.Properties();
        props.setProperty("user", user);
        if (u.getUserInfo() != null && u.getUserInfo().contains(":")) props.setProperty("password", u.getUserInfo().split(":", 2)[1]);
        schema = env("KJOB_SQL_SCHEMA");
        topic = env("KJOB_TEST_TOPIC");
        String orders = env("KJOB_APP_TABLE");
        long seq = Long.parseLong(env("KJOB_TEST_SEQ"));
        StringBuilder out = new StringBuilder("{");
        try (Connection c = DriverManager.getConnection(jdbc, props)) {
            c.setAutoCommit(false);

            // 1. Committed: the order and its jobs together.
            order(c, orders, "o" + seq);
            List<String> committed = new ArrayList<>();
            committed.add(one(c, "java-a", job("java-a", seq, false)));
            committed.add(one(c, "java-b", job("java-b", seq + 1, false)));
            committed.addAll(many(c, "[{\"key\":\"java-a\",\"job\":" + job("java-a", seq + 2, false)
                    + "},{\"key\":\"java-c\",\"job\":" + job("java-c", seq + 3, false) + "}]"));
            c.commit();
            out.append("\"committed\":").append(quoted(committed));

            // 2. Rolled back: neither the order nor its jobs.
            order(c, orders, "o" + (seq + 10));
            List<String> rolled = new ArrayList<>();
            rolled.add(one(c, "java-r", job("java-r", seq + 10, false)));
            rolled.addAll(many(c, "[{\"key\":\"java-r\",\"job\":" + job("java-r", seq + 11, false) + "}]"));
            c.rollback();
            out.append(",\"rolled_back\":").append(quoted(rolled));

            // 3. A job that does not fit the contract, then a good one of the same key.
            String bad = one(c, "java-bad", job("java-bad", seq + 20, true));
            String follower = one(c, "java-bad", job("java-bad", seq + 21, false));
            c.commit();
            out.append(",\"bad\":\"").append(bad).append("\",\"bad_follower\":\"").append(follower).append('"');

            // 4. Delayed: runs no earlier than run_at.
            try (PreparedStatement s = c.prepareStatement("SELECT " + schema
                    + ".enqueue(topic => ?, key => 'java-d', job => ?::jsonb, run_at => now() + interval '2 seconds'),"
                    + " (extract(epoch FROM now() + interval '2 seconds') * 1000)::bigint")) {
                s.setString(1, topic);
                s.setString(2, job("java-d", seq + 30, false));
                try (ResultSet r = s.executeQuery()) {
                    r.next();
                    out.append(",\"delayed\":\"").append(r.getString(1)).append("\",\"delayed_run_at_ms\":").append(r.getLong(2));
                }
            }
            c.commit();

            // An insert-time check fails the statement (and so the transaction).
            try {
                one(c, "java-x", "[1,2]");
                out.append(",\"insert_error\":null");
            } catch (SQLException e) {
                String m = e.getSQLState() + ": " + e.getMessage();
                out.append(",\"insert_error\":\"").append(m.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", " ")).append('"');
            }
            c.rollback();
        }
        System.out.println(out.append('}'));
    }
}
