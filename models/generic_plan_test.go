package models_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// TestAcquireBatchGenericPlansUseIndexes guards the generic plans of models/sql/postgres/idemgate_acquire_batch.sql: idemgate_acquire_batch runs
// with plan_cache_mode = force_generic_plan, so each connection plans each statement of the
// function (and of the idemgate_acquire calls it makes) once, with whatever statistics the
// tables have then, and keeps that plan. A statement whose generic plan scans a table would
// keep scanning it as the table grows, on the path every acquire of a busy instance takes. So
// on an empty database, where a generic plan has no statistics to go by, every path of the
// function (new keys, duplicates and a conflict of a live hold, an attempt_id retry, a takeover
// of an expired key, a lapsed lease) is run with auto_explain logging each nested statement's
// plan to the client, and no plan may hold a sequential scan. (An EXISTS against operations
// written while preparing the generic plans was planned as a hash semi-join over a sequential scan of
// operations; this test fails on it.)
func TestAcquireBatchGenericPlansUseIndexes(t *testing.T) {
	ctx := context.Background()
	dbURL := freshDB(t)
	db := openDB(t, dbURL)
	_, err := models.Migrate(ctx, db, nil)
	require.NoError(t, err)
	tenant := modeltest.Tenant(t, db)

	cfg, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	var mu sync.Mutex
	var plans []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		plans = append(plans, n.Message)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	for _, s := range []string{"LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
		"SET auto_explain.log_nested_statements = on", "SET auto_explain.log_level = notice",
		"SET client_min_messages = notice"} {
		_, err := conn.Exec(ctx, s)
		require.NoError(t, err, s)
	}

	type item struct {
		key, op, attempt string
		ttl              int32
		lease            *int32
	}
	batch := func(items ...item) []string {
		t.Helper()
		n := len(items)
		tenants, keys, ttls, names := make([]int64, n), make([]string, n), make([]int32, n), make([]*string, n)
		atts, callers, ids, hashes := make([]*string, n), make([]string, n), make([]string, n), make([]string, n)
		apiKeys, leases, nulls := make([]int64, n), make([]*int32, n), make([]*string, n)
		for i, it := range items {
			tenants[i], keys[i], ttls[i], names[i] = tenant, it.key, it.ttl, &items[i].op
			if it.attempt != "" {
				atts[i] = &items[i].attempt
			}
			callers[i], ids[i], hashes[i], leases[i], apiKeys[i] = "idg_plans", uuid.NewString(), "hash", it.lease, 7
		}
		rows, err := conn.Query(ctx, `SELECT result FROM idemgate_acquire_batch($1::bigint[], $2::text[],
		  $3::integer[], $4::text[], $5::text[], $5::text[], $5::text[], $6::text[], $7::text[], $8::uuid[],
		  $9::text[], $10::bigint[], $11::integer[], $5::text[], '20ms') ORDER BY ord`,
			tenants, keys, ttls, names, nulls, atts, callers, ids, hashes, apiKeys, leases)
		require.NoError(t, err)
		results, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return results
	}
	one := int32(1)
	// Twice each: a plan is made on the first call in a connection, and a generic plan may
	// only be chosen from the second.
	for round := range 2 {
		k := func(s string) string { return fmt.Sprintf("%s-%d", s, round) }
		require.Equal(t, []string{"admitted", "admitted", "duplicate", "conflict", "admitted"},
			batch(item{key: k("a"), op: "x", ttl: 60}, item{key: k("b"), op: "x", ttl: 1, lease: &one},
				item{key: k("a"), op: "x", ttl: 60}, item{key: k("a"), op: "y", ttl: 60},
				item{key: k("c"), op: "x", ttl: 1, attempt: "att"}))
		require.Equal(t, []string{"duplicate", "duplicate", "duplicate"},
			batch(item{key: k("a"), op: "x", ttl: 60}, item{key: k("a"), op: "x", ttl: 60},
				item{key: k("a"), op: "x", ttl: 60}))
		require.Equal(t, []string{"admitted", "duplicate"},
			batch(item{key: k("c"), op: "x", ttl: 60, attempt: "att"}, item{key: k("a"), op: "x", ttl: 60}))
		modeltest.Elapse(t, db, tenant, time.Second, k("b"), k("c")) // b's lease (1 s) lapses, c's TTL runs out
		require.Equal(t, []string{"admitted", "admitted", "duplicate", "admitted"},
			batch(item{key: k("b"), op: "x", ttl: 60}, item{key: k("c"), op: "x", ttl: 60},
				item{key: k("c"), op: "x", ttl: 60}, item{key: k("d"), op: "x", ttl: 60}))
	}

	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, plans, "auto_explain logged no plan: the check would pass vacuously")
	var nested int
	for _, p := range plans {
		if !strings.Contains(p, "idemgate_acquire_batch(") {
			nested++
		}
		require.NotContains(t, p, "Seq Scan", "a statement of the acquire functions scans a table:\n%s", p)
	}
	require.Greater(t, nested, 20, "the functions' own statements were not logged")
}
