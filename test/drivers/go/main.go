// pgx v5 with its default statement cache (QueryExecModeCacheStatement: every
// query is prepared once per connection under a name derived from its text,
// so all clients use the same names) through the pooler; pgconn's pipeline
// (several Syncs in one write, an error in the middle, a name closed and
// parsed again); a savepoint rolled back and a CopyFrom inside a
// transaction; and a transaction abandoned when its context times out.
//
// Environment: PGHOST PGPORT PGUSER PGPASSWORD PGDATABASE, DRV_CLIENTS
// concurrent connections, DRV_ITERATIONS per connection, DRV_SHARED=1: fail
// unless some server backend served two clients. Exits non-zero on any error
// or wrong result.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const table = "drv_pgx"

var longQuery = "SELECT $1::int + 1 /* " + strings.Repeat("long ", 40000) + "*/"

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig("") // PG* environment variables
	if err != nil {
		return nil, err
	}
	if cfg.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return nil, fmt.Errorf("expected the default exec mode CacheStatement, got %v", cfg.DefaultQueryExecMode)
	}
	return pgx.ConnectConfig(ctx, cfg)
}

// distinct runs 3 statements whose text is this client's and iteration's
// own: 600 in all with 10 clients x 20 iterations, more than the servers keep
// (max_prepared_statements = 200 each).
func distinct(ctx context.Context, conn *pgx.Conn, c, i int) error {
	for j := 0; j < 3; j++ {
		k := c*1000 + i*10 + j
		var n int
		if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT $1::int + %d", k), i).Scan(&n); err != nil {
			return fmt.Errorf("distinct %d: %w", k, err)
		}
		if n != k+i {
			return fmt.Errorf("distinct %d: got %d, want %d", k, n, k+i)
		}
	}
	return nil
}

// pipeline sends, in one write, statements p0..p5 (the same names on every
// client, the texts this client's own) in three Syncs, their executions in
// two more, a division by zero that makes the server skip the rest of its
// part, then p2 closed and parsed again with another text; and checks every
// answer.
func pipeline(ctx context.Context, conn *pgx.Conn, c, i int) error {
	arg := func(v int) [][]byte { return [][]byte{[]byte(strconv.Itoa(v))} }
	p := conn.PgConn().StartPipeline(ctx)
	for k := 0; k < 6; k++ {
		p.SendPrepare(fmt.Sprintf("p%d", k), fmt.Sprintf("SELECT $1::int + %d", c*100+k), nil)
		if k%2 == 1 {
			p.SendPipelineSync()
		}
	}
	for k := 0; k < 6; k++ {
		p.SendQueryPrepared(fmt.Sprintf("p%d", k), arg(i), nil, nil)
		if k%3 == 2 {
			p.SendPipelineSync()
		}
	}
	p.SendQueryParams("SELECT 1 / $1::int", arg(0), nil, nil, nil)
	p.SendQueryPrepared("p1", arg(i), nil, nil) // skipped by the server
	p.SendPipelineSync()
	p.SendDeallocate("p2")
	p.SendPrepare("p2", fmt.Sprintf("SELECT $1::int * -1 - %d", c), nil)
	p.SendQueryPrepared("p2", arg(i), nil, nil)
	for k := 0; k < 6; k++ {
		p.SendDeallocate(fmt.Sprintf("p%d", k))
	}
	p.SendPipelineSync()
	if err := p.Flush(); err != nil {
		p.Close()
		return err
	}
	// what each result must be: "prepare", "sync", "closed", "error CODE" or a number
	var want []string
	for k := 0; k < 6; k++ {
		want = append(want, "prepare")
		if k%2 == 1 {
			want = append(want, "sync")
		}
	}
	for k := 0; k < 6; k++ {
		want = append(want, strconv.Itoa(i+c*100+k))
		if k%3 == 2 {
			want = append(want, "sync")
		}
	}
	want = append(want, "error 22012", "sync", "closed", "prepare", strconv.Itoa(-i-c))
	for k := 0; k < 6; k++ {
		want = append(want, "closed")
	}
	want = append(want, "sync")
	for n, w := range want {
		r, err := p.GetResults()
		got := ""
		var pe *pgconn.PgError
		switch v := r.(type) {
		case nil:
			if !errors.As(err, &pe) {
				p.Close()
				return fmt.Errorf("pipeline %d: want %s: %v", n, w, err)
			}
			got = "error " + pe.Code
		case *pgconn.StatementDescription:
			got = "prepare"
		case *pgconn.PipelineSync:
			got = "sync"
		case *pgconn.CloseComplete:
			got = "closed"
		case *pgconn.ResultReader:
			res := v.Read()
			if errors.As(res.Err, &pe) {
				got = "error " + pe.Code
			} else if res.Err != nil || len(res.Rows) != 1 {
				p.Close()
				return fmt.Errorf("pipeline %d: want %s: %v %q", n, w, res.Err, res.Rows)
			} else {
				got = string(res.Rows[0][0])
			}
		}
		if got != w {
			p.Close()
			return fmt.Errorf("pipeline %d: got %s, want %s", n, got, w)
		}
	}
	return p.Close()
}

// abandon runs a transaction whose context times out in the middle of a
// query: pgx then closes the connection. The pooler must roll back (or close)
// the server before it lends it again: the row inserted here must never show.
// Returns a new connection.
func abandon(ctx context.Context, conn *pgx.Conn, c, i int) (*pgx.Conn, error) {
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	tx, err := conn.Begin(short)
	if err == nil {
		_, err = tx.Exec(short, "INSERT INTO "+table+" (client, iter, v) VALUES ($1, $2, $3)", c, i, 1000000)
	}
	if err == nil {
		_, err = tx.Exec(short, "SELECT pg_sleep(2)")
	}
	if err == nil {
		return nil, fmt.Errorf("pg_sleep(2) did not time out")
	}
	if !pgconn.Timeout(err) {
		return nil, err
	}
	conn.Close(ctx)
	return connect(ctx)
}

// client runs the workload of one connection and returns the backend pids it saw.
func client(ctx context.Context, c, iterations int) (map[int32]bool, error) {
	conn, err := connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer func() { conn.Close(ctx) }()
	pids := map[int32]bool{}
	sum := 0
	for i := 0; i < iterations; i++ {
		var n int
		if err := conn.QueryRow(ctx, "SELECT $1::int + $2::int", c, i).Scan(&n); err != nil {
			return nil, fmt.Errorf("iteration %d: add: %w", i, err)
		}
		if n != c+i {
			return nil, fmt.Errorf("iteration %d: add: got %d, want %d", i, n, c+i)
		}
		var s string
		if err := conn.QueryRow(ctx, "SELECT $1::text || '-' || $2::text", "c"+strconv.Itoa(c), strconv.Itoa(i)).Scan(&s); err != nil {
			return nil, fmt.Errorf("iteration %d: concat: %w", i, err)
		}
		if want := fmt.Sprintf("c%d-%d", c, i); s != want {
			return nil, fmt.Errorf("iteration %d: concat: got %q, want %q", i, s, want)
		}
		rows, err := conn.Query(ctx, "SELECT g FROM generate_series(1, $1::int) g", i+1)
		if err != nil {
			return nil, fmt.Errorf("iteration %d: series: %w", i, err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return nil, fmt.Errorf("iteration %d: series: %w", i, err)
		}
		if len(got) != i+1 || got[i] != int32(i+1) {
			return nil, fmt.Errorf("iteration %d: series: got %v", i, got)
		}
		if err := distinct(ctx, conn, c, i); err != nil {
			return nil, fmt.Errorf("iteration %d: %w", i, err)
		}
		// a batch: the cached statements pipelined, one Sync
		batch := &pgx.Batch{}
		batch.Queue("SELECT $1::int + $2::int", i, c)
		batch.Queue("SELECT $1::text || '-' || $2::text", "b", strconv.Itoa(i))
		batch.Queue("SELECT $1::int + $2::int", c, c)
		br := conn.SendBatch(ctx, batch)
		var b1, b3 int
		var b2 string
		err = br.QueryRow().Scan(&b1)
		if err == nil {
			err = br.QueryRow().Scan(&b2)
		}
		if err == nil {
			err = br.QueryRow().Scan(&b3)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("iteration %d: batch: %w", i, err)
		}
		if b1 != i+c || b2 != fmt.Sprintf("b-%d", i) || b3 != 2*c {
			return nil, fmt.Errorf("iteration %d: batch: got %d %q %d", i, b1, b2, b3)
		}
		// a statement longer than the pooler's packet buffer
		if err := conn.QueryRow(ctx, longQuery, i).Scan(&n); err != nil {
			return nil, fmt.Errorf("iteration %d: long: %w", i, err)
		}
		if n != i+1 {
			return nil, fmt.Errorf("iteration %d: long: got %d, want %d", i, n, i+1)
		}
		if err := pipeline(ctx, conn, c, i); err != nil {
			return nil, fmt.Errorf("iteration %d: pipeline: %w", i, err)
		}
		if err := conn.Ping(ctx); err != nil { // an empty query
			return nil, fmt.Errorf("iteration %d: ping: %w", i, err)
		}
		var pid int32
		if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return nil, fmt.Errorf("iteration %d: pid: %w", i, err)
		}
		pids[pid] = true

		// a transaction: prepared statements inside it, a savepoint rolled
		// back after an error, a CopyFrom of rows that do not count, then COMMIT
		v := c*1000 + i
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (client, iter, v) VALUES ($1, $2, $3)", c, i, v); err != nil {
				return fmt.Errorf("insert: %w", err)
			}
			sp, err := tx.Begin(ctx)
			if err != nil {
				return fmt.Errorf("savepoint: %w", err)
			}
			if _, err := sp.Exec(ctx, "INSERT INTO "+table+" (client, iter, v) VALUES ($1, $2, $3)", c, i, 1000000); err != nil {
				return fmt.Errorf("insert after savepoint: %w", err)
			}
			var pe *pgconn.PgError
			if _, err := sp.Exec(ctx, "SELECT 1 / $1::int", 0); !errors.As(err, &pe) || pe.Code != "22012" {
				return fmt.Errorf("division by zero after savepoint: %v", err)
			}
			if err := sp.Rollback(ctx); err != nil {
				return fmt.Errorf("rollback to savepoint: %w", err)
			}
			rows := [][]any{{-c, i, 1}, {-c, i, 2}, {-c, i, 3}}
			if n, err := tx.CopyFrom(ctx, pgx.Identifier{table}, []string{"client", "iter", "v"}, pgx.CopyFromRows(rows)); err != nil || n != 3 {
				return fmt.Errorf("copy: %d rows: %v", n, err)
			}
			var count int
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE client = $1", c).Scan(&count); err != nil {
				return fmt.Errorf("count: %w", err)
			}
			if count != i+1 {
				return fmt.Errorf("count: got %d, want %d", count, i+1)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("iteration %d: transaction: %w", i, err)
		}
		sum += v
		if i == 7 {
			if conn, err = abandon(ctx, conn, c, i); err != nil {
				return nil, fmt.Errorf("iteration %d: abandoned transaction: %w", i, err)
			}
		}
	}
	// the distinct statements again: the servers evicted most of them
	for i := 0; i < iterations; i++ {
		if err := distinct(ctx, conn, c, i); err != nil {
			return nil, fmt.Errorf("again, iteration %d: %w", i, err)
		}
	}
	var total int
	if err := conn.QueryRow(ctx, "SELECT coalesce(sum(v), 0)::int FROM "+table+" WHERE client = $1", c).Scan(&total); err != nil {
		return nil, fmt.Errorf("final sum: %w", err)
	}
	if total != sum {
		return nil, fmt.Errorf("final sum: got %d, want %d", total, sum)
	}
	var copied int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE client = $1", -c).Scan(&copied); err != nil {
		return nil, fmt.Errorf("copied rows: %w", err)
	}
	if copied != 3*iterations {
		return nil, fmt.Errorf("copied rows: got %d, want %d", copied, 3*iterations)
	}
	return pids, nil
}

func run() error {
	clients := envInt("DRV_CLIENTS", 10)
	iterations := envInt("DRV_ITERATIONS", 20)
	mustShare := os.Getenv("DRV_SHARED") == "1"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	setup, err := connect(ctx)
	if err != nil {
		return fmt.Errorf("setup: connect: %w", err)
	}
	_, err = setup.Exec(ctx, "DROP TABLE IF EXISTS "+table)
	if err == nil {
		_, err = setup.Exec(ctx, "CREATE TABLE "+table+" (client int, iter int, v int)")
	}
	setup.Close(ctx)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	users := map[int32]int{} // backend pid -> how many clients it served
	for c := 1; c <= clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			seen, err := client(ctx, c, iterations)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("client %d: %w", c, err))
				return
			}
			for p := range seen {
				users[p]++
			}
		}(c)
	}
	wg.Wait()
	for _, e := range errs {
		fmt.Fprintln(os.Stderr, e)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d clients failed", len(errs), clients)
	}
	shared := 0
	for _, n := range users {
		if n > 1 {
			shared++
		}
	}
	if mustShare && shared == 0 {
		return fmt.Errorf("no server backend served two clients (%d backends): the servers were not shared", len(users))
	}
	fmt.Printf("pgx: %d clients x %d iterations ok, %d server backends, %d of them served several clients\n",
		clients, iterations, len(users), shared)
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pgx:", err)
		os.Exit(1)
	}
}
