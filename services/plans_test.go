package services

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReadSidePlansUseTheirIndexes: with enough rows for the planner to care (60,000 attempts,
// 1 in 60 a duplicate, and 20,000 operations, over 60 days), the Audit's two scans and the Overview's figures read
// along the indexes and tables of migration 00014, not across the attempt log. No timing: a
// query that stops using its index fails here, on any machine (docs: README "Scale").
func TestReadSidePlansUseTheirIndexes(t *testing.T) {
	t.Parallel()
	onPostgres(t, func(t *testing.T, b *testBundle) {
		require.NoError(t, b.db.Exec(`INSERT INTO attempts (tenant_id, key, result, caller, attempted_at)
SELECT ?, 'plan-' || g, CASE WHEN g % 60 = 0 THEN 'duplicate' ELSE 'admitted' END, 'idg_plan',
       now() - (g * interval '86 seconds')
  FROM generate_series(1, 60000) g`, b.p.TenantID).Error)
		require.NoError(t, b.db.Exec(`INSERT INTO idem_keys (tenant_id, key, fencing_token, last_operation_id, acquired_at)
SELECT ?, 'plan-' || g, 1, gen_random_uuid(), now() - (g * interval '259 seconds') FROM generate_series(1, 20000) g`, b.p.TenantID).Error)
		require.NoError(t, b.db.Exec(`INSERT INTO operations (id, tenant_id, key, key_id, state, fencing_token, owner_token_hash, acquired_at, expires_at)
SELECT k.last_operation_id, k.tenant_id, k.key, k.id, 'succeeded', 1, 'plan', k.acquired_at, k.acquired_at + interval '1 hour'
  FROM idem_keys k WHERE k.tenant_id = ?`, b.p.TenantID).Error)
		require.NoError(t, b.db.Exec("ANALYZE attempts").Error)
		require.NoError(t, b.db.Exec("ANALYZE operations").Error)
		to := time.Now().UTC()
		from := to.Add(-24 * time.Hour)

		plan := func(sql string, args ...any) string {
			t.Helper()
			var lines []string
			require.NoError(t, b.db.Raw("EXPLAIN "+sql, args...).Scan(&lines).Error)
			return strings.Join(lines, "\n")
		}
		p := plan(`SELECT tenant_id, key, result, attempted_at, id FROM attempts
 WHERE result <> 'admitted' AND attempted_at >= ? AND attempted_at < ? AND tenant_id = ?
 ORDER BY attempted_at DESC, id DESC LIMIT 20000`, from, to, b.p.TenantID)
		require.Contains(t, p, "attempts_audited", "the Audit's duplicates scan:\n%s", p)
		p = plan(`SELECT tenant_id, key, acquired_at FROM operations
 WHERE possible_duplicate_effect AND acquired_at >= ? AND acquired_at < ? ORDER BY acquired_at DESC LIMIT 20000`, from, to)
		require.Contains(t, p, "operations_flagged", "the Audit's flagged admissions:\n%s", p)
		p = plan(`SELECT a.id FROM attempts a WHERE a.result <> 'admitted' AND a.attempted_at >= ? AND a.attempted_at < ?
 AND a.attempted_at >= ? AND (a.attempted_at > ? OR a.id > ?) ORDER BY a.attempted_at, a.id LIMIT 2000`, from, to, from, from, 0)
		require.Contains(t, p, "attempts_audited", "the CSV export's duplicates:\n%s", p)
		for _, tenant := range []bool{true, false} {
			var args []any
			if tenant {
				args = []any{b.p.TenantID, b.p.TenantID}
			}
			p = plan(stateCountsSQL(tenant), args...)
			require.NotContains(t, p, "operations ", "the Overview's counts read no operation:\n%s", p)
			hargs := []any{hourKey(from), hourKey(to)}
			if tenant {
				hargs = append(hargs, b.p.TenantID)
			}
			p = plan(attemptHoursSQL(tenant), append(hargs, hargs...)...)
			require.NotContains(t, p, "attempts ", "the Overview's chart reads no attempt:\n%s", p)
		}
	})
}
