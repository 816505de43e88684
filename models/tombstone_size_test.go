package models_test

import (
	"context"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
)

// TestTombstoneBytes measures what a tombstone adds to its key row on PostgreSQL, indexes
// included (docs/reference.md §2 "Lifecycle"; issue 30 asks for at most 128 bytes): two copies
// of the key table (CREATE TABLE … (LIKE idem_keys INCLUDING ALL): the same columns and
// indexes), each filled by one INSERT of the same 20,000 keys as a purge leaves them, the
// second with the tombstone columns filled with a typical success (a 27-character receipt).
//
// Why copies filled by INSERT: the first version wrote the tombstones with an UPDATE and
// compacted with VACUUM FULL, which keeps every row version that a transaction anywhere in
// the server might still see; with other test packages busy on the same server it once
// measured 272 bytes per tombstone (every old row version kept) instead of 90. Rows that were
// never updated have no dead versions, so the sizes depend only on the rows, and this is a
// size check, not a timing.
func TestTombstoneBytes(t *testing.T) {
	dbURL, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)
	ctx := context.Background()
	db, err := models.Open(ctx, models.OpenOptions{DatabaseURL: dbURL, MaxConns: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = models.Migrate(ctx, db, nil)
	require.NoError(t, err)
	const n = 20000
	require.NoError(t, db.Exec("INSERT INTO tenants (name) VALUES ('sizes')").Error)
	fill := func(table, tombstone string) (size, total int64) {
		require.NoError(t, db.Exec("CREATE TABLE "+table+" (LIKE idem_keys INCLUDING ALL)").Error)
		require.NoError(t, db.Exec(`INSERT INTO `+table+` (tenant_id, key, fencing_token, last_operation_id, acquired_at`+tombstone+`)
SELECT (SELECT id FROM tenants WHERE name = 'sizes'), 'order:' || lpad(g::text, 10, '0'), 1, gen_random_uuid(),
       now() - g * interval '1 second'`+map[bool]string{true: `,
       now() + interval '400 days', gen_random_uuid(), 1, 'succeeded', 'succeeded', 'ch_3MqB9x2eZvKYlo2C1a2b3c4d',
       idemgate_request_hash('charge', md5(g::text))`}[tombstone != ""]+`
FROM generate_series(1, ?) g ORDER BY g`, n).Error)
		require.NoError(t, db.Raw("SELECT pg_relation_size(?::regclass), pg_total_relation_size(?::regclass)", table, table).
			Row().Scan(&size, &total))
		return size, total
	}
	table0, total0 := fill("keys_plain", "")
	table1, total1 := fill("keys_tombstoned", `, protected_until, protected_by, tomb_fencing_token, tomb_state,
  tomb_outcome_status, tomb_outcome_receipt, tomb_request_hash`)
	perTomb := float64(total1-total0) / n
	t.Logf("PostgreSQL, %d keys: key rows with their indexes %.0f bytes per key before, %.0f with a tombstone: "+
		"%.1f bytes per tombstone (table %.1f, indexes %.1f)", n, float64(total0)/n, float64(total1)/n, perTomb,
		float64(table1-table0)/n, float64((total1-table1)-(total0-table0))/n)
	require.Positive(t, perTomb, "a tombstone takes room")
	require.LessOrEqual(t, perTomb, 128.0, "bytes per tombstone")
}
