// pgjdbc with prepareThreshold=1: every PreparedStatement becomes a named
// server-side statement (S_1, S_2, ... per connection, so all clients use the
// same names) from its first execution, through the pooler; a query
// timeout, which pgjdbc implements with a cancel request; and a column added
// under a prepared statement, which pgjdbc recovers from by preparing it again.
//
// Run as a single-file program: java -cp postgresql.jar Drivers.java
// Environment: PGHOST PGPORT PGUSER PGPASSWORD PGDATABASE, DRV_CLIENTS
// concurrent connections, DRV_ITERATIONS per connection, DRV_SHARED=1: fail
// unless some server backend served two clients. Exits non-zero on any error
// or wrong result.

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

public class Drivers {
    static final String TABLE = "drv_jdbc";
    static final String LONG_QUERY = "SELECT ?::int + 1 /* " + "long ".repeat(40000) + "*/";

    static int env(String name, int def) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? def : Integer.parseInt(v);
    }

    static Connection connect() throws SQLException {
        return connect("");
    }

    static Connection connect(String options) throws SQLException {
        String url = String.format("jdbc:postgresql://%s:%s/%s?prepareThreshold=1&connectTimeout=10&socketTimeout=120%s",
                System.getenv("PGHOST"), System.getenv("PGPORT"), System.getenv("PGDATABASE"), options);
        return DriverManager.getConnection(url, System.getenv("PGUSER"), System.getenv("PGPASSWORD"));
    }

    static void check(String what, Object got, Object want) {
        if (!got.equals(want)) {
            throw new IllegalStateException(what + ": got " + got + ", want " + want);
        }
    }

    // Runs a query with parameters and returns the first column of every row.
    static List<Object> query(Connection conn, String what, String sql, Object... params) throws SQLException {
        try (PreparedStatement ps = conn.prepareStatement(sql)) {
            for (int k = 0; k < params.length; k++) {
                ps.setObject(k + 1, params[k]);
            }
            List<Object> rows = new ArrayList<>();
            try (ResultSet rs = ps.executeQuery()) {
                while (rs.next()) {
                    rows.add(rs.getObject(1));
                }
            }
            return rows;
        } catch (SQLException e) {
            throw new SQLException(what + ": " + e.getMessage() + " (SQLSTATE " + e.getSQLState() + ")", e);
        }
    }

    // 3 statements whose text is this client's and iteration's own: 600 in all
    // with 10 clients x 20 iterations, more than the servers keep
    // (max_prepared_statements = 200 each).
    static void distinct(Connection conn, int c, int i, String at) throws SQLException {
        for (int j = 0; j < 3; j++) {
            int k = c * 1000 + i * 10 + j;
            check(at + "distinct " + k, query(conn, at + "distinct " + k, "SELECT ?::int + " + k, i).get(0), k + i);
        }
    }

    // A query timeout: pgjdbc sends a cancel request, which must reach the
    // server this client holds (it is in a transaction) and nobody else's.
    static void cancel(Connection conn, String at) throws SQLException {
        conn.setAutoCommit(false);
        try (Statement st = conn.createStatement()) {
            st.execute("SELECT 1");
            st.setQueryTimeout(1);
            try {
                st.execute("SELECT pg_sleep(5)");
                throw new IllegalStateException(at + "cancel: pg_sleep(5) was not canceled");
            } catch (SQLException e) {
                check(at + "cancel: SQLSTATE of " + e.getMessage(), e.getSQLState(), "57014");
            }
        } finally {
            conn.rollback();
            conn.setAutoCommit(true);
        }
    }

    static void client(int c, int iterations, Map<Object, Set<Integer>> users) throws Exception {
        try (Connection conn = connect()) {
            long sum = 0;
            for (int i = 0; i < iterations; i++) {
                String at = "iteration " + i + ": ";
                check(at + "add", query(conn, at + "add", "SELECT ?::int + ?::int", c, i).get(0), c + i);
                check(at + "concat", query(conn, at + "concat", "SELECT ?::text || '-' || ?::text", "c" + c, "" + i).get(0),
                        "c" + c + "-" + i);
                List<Object> series = query(conn, at + "series", "SELECT g FROM generate_series(1, ?::int) g", i + 1);
                check(at + "series length", series.size(), i + 1);
                check(at + "series last", series.get(i), i + 1);
                distinct(conn, c, i, at);
                // a statement longer than the pooler's packet buffer
                check(at + "long", query(conn, at + "long", LONG_QUERY, i).get(0), i + 1);
                Object pid = query(conn, at + "pid", "SELECT pg_backend_pid()").get(0);
                users.computeIfAbsent(pid, k -> ConcurrentHashMap.newKeySet()).add(c);

                // a transaction: prepared statements inside it, then COMMIT
                int v = c * 1000 + i;
                conn.setAutoCommit(false);
                try {
                    // a batch: the row that counts and two with client -c, pipelined, one Sync
                    try (PreparedStatement ps = conn.prepareStatement("INSERT INTO " + TABLE + " (client, iter, v) VALUES (?, ?, ?)")) {
                        int[][] rows = {{c, i, v}, {-c, i, 1}, {-c, i, 2}};
                        for (int[] row : rows) {
                            ps.setInt(1, row[0]);
                            ps.setInt(2, row[1]);
                            ps.setInt(3, row[2]);
                            ps.addBatch();
                        }
                        int[] counts = ps.executeBatch();
                        check(at + "insert batch", counts.length, 3);
                        for (int n : counts) {
                            check(at + "insert batch count", n, 1);
                        }
                    } catch (SQLException e) {
                        throw new SQLException(at + "insert batch: " + e.getMessage() + " (SQLSTATE " + e.getSQLState() + ")", e);
                    }
                    check(at + "count", query(conn, at + "count", "SELECT count(*)::int FROM " + TABLE + " WHERE client = ?", c).get(0),
                            i + 1);
                    // a fetch size inside a transaction: a portal read 3 rows at a time,
                    // one Execute and Sync each, on the server the transaction holds
                    try (PreparedStatement ps = conn.prepareStatement("SELECT g FROM generate_series(1, ?::int) g")) {
                        ps.setFetchSize(3);
                        ps.setInt(1, 10 + i);
                        long got = 0;
                        try (ResultSet rs = ps.executeQuery()) {
                            while (rs.next()) {
                                got += rs.getInt(1);
                            }
                        }
                        check(at + "fetch size", got, (long) (10 + i) * (11 + i) / 2);
                    }
                    conn.commit();
                } catch (Exception e) {
                    try {
                        conn.rollback();
                    } catch (SQLException ignored) {
                    }
                    throw e;
                } finally {
                    conn.setAutoCommit(true);
                }
                sum += v;
                if (i == 7) {
                    cancel(conn, at);
                }
            }
            // the distinct statements again: the servers evicted most of them
            for (int i = 0; i < iterations; i++) {
                distinct(conn, c, i, "again, iteration " + i + ": ");
            }
            check("final sum", query(conn, "final sum", "SELECT coalesce(sum(v), 0)::bigint FROM " + TABLE + " WHERE client = ?", c).get(0),
                    sum);
            check("final count", query(conn, "final count", "SELECT count(*)::int FROM " + TABLE + " WHERE client = ?", -c).get(0),
                    2 * iterations);
        }
    }

    // A column added under a server-prepared statement: its next execution
    // fails with 0A000 ("cached plan must not change result type") and pgjdbc
    // prepares it again, once: in autocommit at once, inside a transaction
    // with autosave=conservative after ROLLBACK TO SAVEPOINT. Beforehand two
    // transactions at once prepare the query on two servers (all the pool has
    // with one worker), so both have it stale.
    static void schemaChange() throws Exception {
        String sql = "SELECT * FROM " + TABLE + "_schema WHERE a = ?";
        try (Connection setup = connect(); Statement st = setup.createStatement();
                Connection plain = connect(); Connection autosave = connect("&autosave=conservative")) {
            st.execute("DROP TABLE IF EXISTS " + TABLE + "_schema");
            st.execute("CREATE TABLE " + TABLE + "_schema (a int, b int)");
            st.execute("INSERT INTO " + TABLE + "_schema VALUES (1, 2)");
            Set<Object> pids = new java.util.HashSet<>();
            for (Connection conn : List.of(plain, autosave)) {
                conn.setAutoCommit(false);
                check("schema change: before", query(conn, "schema change: before", sql, 1).size(), 1);
                pids.add(query(conn, "schema change: pid", "SELECT pg_backend_pid()").get(0));
            }
            check("schema change: servers", pids.size(), 2);
            for (Connection conn : List.of(plain, autosave)) {
                conn.commit();
                conn.setAutoCommit(true);
            }
            st.execute("ALTER TABLE " + TABLE + "_schema ADD COLUMN c int DEFAULT 3");
            // autocommit: the retry may get the other server
            checkColumns(plain, "schema change: autocommit", sql);
            // a transaction: the retry runs on the server the transaction holds
            autosave.setAutoCommit(false);
            query(autosave, "schema change: in a transaction", "SELECT 1");
            checkColumns(autosave, "schema change: in a transaction", sql);
            autosave.commit();
        }
    }

    static void checkColumns(Connection conn, String what, String sql) throws SQLException {
        try (PreparedStatement ps = conn.prepareStatement(sql)) {
            ps.setInt(1, 1);
            try (ResultSet rs = ps.executeQuery()) {
                check(what + ": a row", rs.next(), true);
                check(what + ": columns", rs.getMetaData().getColumnCount(), 3);
                check(what + ": new column", rs.getInt(3), 3);
            }
        } catch (SQLException e) {
            throw new SQLException(what + ": " + e.getMessage() + " (SQLSTATE " + e.getSQLState() + ")", e);
        }
    }

    public static void main(String[] args) throws Exception {
        int clients = env("DRV_CLIENTS", 10);
        int iterations = env("DRV_ITERATIONS", 20);
        boolean mustShare = "1".equals(System.getenv("DRV_SHARED"));
        try (Connection setup = connect(); Statement st = setup.createStatement()) {
            st.execute("DROP TABLE IF EXISTS " + TABLE);
            st.execute("CREATE TABLE " + TABLE + " (client int, iter int, v int)");
        }

        Map<Object, Set<Integer>> users = new ConcurrentHashMap<>(); // backend pid -> the clients it served
        ExecutorService pool = Executors.newFixedThreadPool(clients);
        List<Future<?>> runs = new ArrayList<>();
        for (int c = 1; c <= clients; c++) {
            final int cc = c;
            runs.add(pool.submit(() -> {
                client(cc, iterations, users);
                return null;
            }));
        }
        pool.shutdown();
        if (!pool.awaitTermination(5, TimeUnit.MINUTES)) {
            System.err.println("pgjdbc: timed out after 5 minutes");
            System.exit(1);
        }
        int failed = 0;
        for (int c = 1; c <= clients; c++) {
            try {
                runs.get(c - 1).get();
            } catch (Exception e) {
                failed++;
                Throwable t = e.getCause();
                String state = t instanceof SQLException ? ((SQLException) t).getSQLState() : null;
                System.err.println("client " + c + ": " + t + (state != null ? " (SQLSTATE " + state + ")" : ""));
            }
        }
        if (failed > 0) {
            System.err.println("pgjdbc: " + failed + " of " + clients + " clients failed");
            System.exit(1);
        }
        try {
            schemaChange();
        } catch (Exception e) {
            System.err.println("pgjdbc: " + e);
            System.exit(1);
        }
        long shared = users.values().stream().filter(s -> s.size() > 1).count();
        if (mustShare && shared == 0) {
            System.err.println("pgjdbc: no server backend served two clients (" + users.size() + " backends): the servers were not shared");
            System.exit(1);
        }
        System.out.println("pgjdbc: " + clients + " clients x " + iterations + " iterations ok, " + users.size()
                + " server backends, " + shared + " of them served several clients");
    }
}
