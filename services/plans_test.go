package services

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// TestReadSidePlansUseTheirIndexes: with enough rows for the planner to care (60,000 attempts,
// 1 in 60 a duplicate, and 20,000 operations, over 60 days), the Audit's walks, its page's
// counts and the Overview's figures read
// along the indexes and tables of the read side, not across the attempt log. No timing: a
// query that stops using its index fails here, on any machine (docs/operations.md "At size:
// make scale").
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
		p := plan(`SELECT id, tenant_id, key, attempted_at FROM attempts
 WHERE result <> 'admitted' AND attempted_at >= ? AND attempted_at < ? AND tenant_id = ?
 ORDER BY attempted_at DESC, id DESC LIMIT 1000`, from, to, b.p.TenantID)
		require.Contains(t, p, "attempts_audited", "the Audit's duplicates walk:\n%s", p)
		p = plan(`SELECT id, tenant_id, key, attempted_at FROM attempts
 WHERE result <> 'admitted' AND attempted_at >= ? AND attempted_at < ? AND (attempted_at, id) < (?, ?)
 ORDER BY attempted_at DESC, id DESC LIMIT 1000`, from, to, to.Add(-time.Hour), 1<<40)
		require.Contains(t, p, "attempts_audited", "the Audit's duplicates walk, further on:\n%s", p)
		p = plan(`SELECT k.tenant_id, k.key, SUM(CASE WHEN a.result = 'duplicate' THEN 1 ELSE 0 END), MIN(a.attempted_at), MAX(a.id)
FROM idem_keys k JOIN operations o ON o.key_id = k.id JOIN attempts a ON a.operation_id = o.id
WHERE k.tenant_id IN (?) AND k.key IN ('plan-1', 'plan-2', 'plan-3') AND a.result <> 'admitted' AND a.attempted_at >= ? AND a.attempted_at < ?
GROUP BY k.tenant_id, k.key`, b.p.TenantID, from, to)
		require.Contains(t, p, "attempts_operation", "the Audit page's counts:\n%s", p)
		require.NotRegexp(t, "Seq Scan on (attempts|operations|idem_keys)", p, "the Audit page's counts:\n%s", p)
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

// TestKeysListPlansUseTheirIndexes: the Keys list (dashboard and GET /v1/keys), for each kind
// of filter, walk an index to their page instead of reading every key.
// The statements are the ones listKeys builds (keyPageQuery),
// printed by GORM's dry run, over 20,000 keys whose newest operations are 2% uncertain, 5%
// released, 0.1% live holds and the rest succeeded; and the capped count (CountKeys) of each
// filter walks the same index, never hashing every key and operation (which PostgreSQL chose
// for a plain join whenever the filter's rows were near the cap: 163 ms at 200,000 keys).
func TestKeysListPlansUseTheirIndexes(t *testing.T) {
	t.Parallel()
	onPostgres(t, func(t *testing.T, b *testBundle) {
		require.NoError(t, b.db.Exec(`INSERT INTO idem_keys (tenant_id, key, fencing_token, last_operation_id, acquired_at)
SELECT ?, 'list-' || (g % 10) || ':' || (g / 10 % 100) || ':' || g, 1, gen_random_uuid(), now() - (g * interval '259 seconds')
  FROM generate_series(1, 20000) g`, b.p.TenantID).Error)
		require.NoError(t, b.db.Exec(`INSERT INTO operations (id, tenant_id, key, key_id, state, fencing_token, owner_token_hash, acquired_at, expires_at, operation_name)
SELECT k.last_operation_id, k.tenant_id, k.key, k.id,
       CASE WHEN k.id % 50 = 7 THEN 'uncertain' WHEN k.id % 20 = 3 THEN 'released'
            WHEN k.id % 1000 = 5 THEN 'in_progress' ELSE 'succeeded' END,
       1, 'plan', k.acquired_at, k.acquired_at + interval '1 hour', 'charge'
  FROM idem_keys k WHERE k.tenant_id = ? AND k.key LIKE 'list-%'`, b.p.TenantID).Error)
		require.NoError(t, b.db.Exec("ANALYZE idem_keys").Error)
		require.NoError(t, b.db.Exec("ANALYZE operations").Error)
		now := time.Now().UTC()
		cursor := encodeCursor(now.Add(-30*24*time.Hour), 1<<40)
		explain := func(q *gorm.DB) string {
			t.Helper()
			var rows []models.IdemKey
			st := q.Find(&rows).Statement
			var lines []string
			require.NoError(t, b.db.Raw("EXPLAIN "+st.SQL.String(), st.Vars...).Scan(&lines).Error)
			return strings.Join(lines, "\n")
		}
		dry := b.db.Session(&gorm.Session{DryRun: true})
		tenant := &b.p.TenantID
		for _, c := range []struct {
			name   string
			tenant *int64
			f      KeyFilter
			index  string
		}{
			// Either newest-first index: the test's tenant holds nearly every row.
			{"newest keys", tenant, KeyFilter{}, "Index (Only )?Scan using idem_keys_(tenant_)?acquired "},
			{"newest keys, every tenant", nil, KeyFilter{}, "idem_keys_acquired "},
			{"uncertain", tenant, KeyFilter{State: StateUncertain}, "operations_(listed(_all)?|uncertain_queue(_all)?) "},
			// Or operations_lease: it too holds only the operations in progress.
			{"live holds, every tenant", nil, KeyFilter{State: StateInProgress}, "operations_(listed_all|lease) "},
			{"released, deep page", tenant, KeyFilter{State: StateReleased, Cursor: cursor}, "operations_listed(_all)? "},
			{"released, newer page", tenant, KeyFilter{State: StateReleased, Before: cursor}, "operations_listed(_all)? "},
			// Or the reconciliation queue's: it too holds only uncertain operations.
			{"uncertain by operation", tenant, KeyFilter{State: StateUncertain, Operation: "charge"}, "operations_(listed(_all)?|uncertain_queue(_all)?) "},
			{"prefix", tenant, KeyFilter{KeyPrefix: "list-3:12:"}, "idem_keys_tenant_id_key_key"},
			{"prefix, every tenant", nil, KeyFilter{KeyPrefix: "list-3:12:"}, "idem_keys_tenant_id_key_key"},
		} {
			f := c.f
			f.Limit = DefaultListLimit
			p := explain(keyPageQuery(dry, newStore(b.db), c.tenant, f, now))
			require.Regexp(t, c.index, p, "%s, the page:\n%s", c.name, p)
			require.NotRegexp(t, "Seq Scan on (idem_keys|operations)", p, "%s, the page:\n%s", c.name, p)
			if f.Cursor != "" || f.Before != "" {
				continue // the count has no cursor
			}
			cq, atCol, idCol := keyFilterQuery(dry, newStore(b.db), c.tenant, f, now)
			st := countKeysQuery(dry, cq, atCol, idCol).Scan(new(int64)).Statement
			var lines []string
			require.NoError(t, b.db.Raw("EXPLAIN "+st.SQL.String(), st.Vars...).Scan(&lines).Error)
			p = strings.Join(lines, "\n")
			require.Regexp(t, c.index, p, "%s, the count:\n%s", c.name, p)
			require.NotRegexp(t, "Seq Scan on (idem_keys|operations)|Hash Join", p, "%s, the count:\n%s", c.name, p)
		}
	})
}

// TestPurgePlansUseTheirIndexes: over 40,000 ended operations, half with a purge_after (a
// policy's retention) and half ended before lifecycles (none), each of the purge's walks reads
// its own partial index from where the last batch ended, never the operations table: a purge
// that scanned the table would read every operation once per batch of 1,000.
func TestPurgePlansUseTheirIndexes(t *testing.T) {
	t.Parallel()
	onPostgres(t, func(t *testing.T, b *testBundle) {
		require.NoError(t, b.db.Exec(`INSERT INTO idem_keys (tenant_id, key, fencing_token, last_operation_id, acquired_at)
SELECT ?, 'purge-' || g, 1, gen_random_uuid(), now() - (g * interval '129 seconds') FROM generate_series(1, 40000) g`, b.p.TenantID).Error)
		require.NoError(t, b.db.Exec(`INSERT INTO operations (id, tenant_id, key, key_id, state, fencing_token, owner_token_hash,
  acquired_at, expires_at, ended_at, retention_seconds, purge_after)
SELECT k.last_operation_id, k.tenant_id, k.key, k.id, 'succeeded', 1, 'plan', k.acquired_at, k.acquired_at + interval '1 hour',
       k.acquired_at + interval '1 minute', CASE WHEN k.id % 2 = 0 THEN 86400 END,
       CASE WHEN k.id % 2 = 0 THEN k.acquired_at + interval '1 day' END
  FROM idem_keys k WHERE k.tenant_id = ? AND k.key LIKE 'purge-%'`, b.p.TenantID).Error)
		require.NoError(t, b.db.Exec("ANALYZE operations").Error)
		now := time.Now().UTC()
		dry := b.db.Session(&gorm.Session{DryRun: true})
		for i, src := range purgeSources(now, 30*24*time.Hour) {
			for _, after := range []*purgeCandidate{nil, {ID: "00000000-0000-0000-0000-000000000000", Mark: now.Add(-40 * 24 * time.Hour)}} {
				var cands []purgeCandidate
				st := purgeScan(dry, src, after, 1000).Find(&cands).Statement
				var lines []string
				require.NoError(t, b.db.Raw("EXPLAIN "+st.SQL.String(), st.Vars...).Scan(&lines).Error)
				p := strings.Join(lines, "\n")
				require.Contains(t, p, []string{"operations_purge", "operations_ended"}[i], "%s:\n%s", src.column, p)
				require.NotContains(t, p, "Seq Scan on operations", "%s:\n%s", src.column, p)
			}
		}
	})
}

// TestPrefixEnd: prefixEnd bounds exactly the strings that start with its argument, in the
// byte order both databases compare keys in (UTF-8 byte order is code point order).
func TestPrefixEnd(t *testing.T) {
	for p, want := range map[string]string{
		"order:3:12":  "order:3:13",
		"a\U0010FFFF": "b",
		"é":           "ê",
		"\uD7FF":      "\uE000",
		"x\uFFFF":     "x\U00010000",
	} {
		got, ok := prefixEnd(p)
		require.True(t, ok, p)
		require.Equal(t, want, got, "prefixEnd(%q)", p)
	}
	for _, p := range []string{"", "\U0010FFFF\U0010FFFF"} {
		_, ok := prefixEnd(p)
		require.False(t, ok, "prefixEnd(%q) has no bound", p)
	}
}

// FuzzPrefixEnd: for any valid UTF-8 prefix p and key k, k starts with p exactly when
// p <= k < prefixEnd(p) byte-wise: the range the Keys list reads is the prefix filter.
func FuzzPrefixEnd(f *testing.F) {
	f.Add("order:3:12", "order:3:12:77")
	f.Add("a\U0010FFFF", "a\U0010FFFFz")
	f.Add("\uD7FF", "\uE000")
	f.Fuzz(func(t *testing.T, p, k string) {
		if !utf8.ValidString(p) || !utf8.ValidString(k) {
			return
		}
		end, ok := prefixEnd(p)
		in := p <= k && (!ok || k < end)
		if in != strings.HasPrefix(k, p) {
			t.Fatalf("prefix %q, key %q: in range %v (end %q, %v), HasPrefix %v", p, k, in, end, ok, strings.HasPrefix(k, p))
		}
		if ok && !utf8.ValidString(end) {
			t.Fatalf("prefixEnd(%q) = %q is not UTF-8", p, end)
		}
	})
}

// TestWarnedGenerationPlans: a key reused as a lock (acquired and released over and over)
// keeps every released generation until the purge, about 600,000 a week at one a second. The
// queries that look for its generations that may have had an effect (previous_operation, the
// possible-duplicate flag, the webhook event) go along operations_effect, which holds only
// those, instead of walking every released generation (issue 32).
//
// Not parallel, and its rows are deleted when it ends: the package's tests share one
// operations table, and 20,000 rows of one key, ANALYZEd while TestPurgePlansUseTheirIndexes
// planned its scans, once turned that test's plan into a sequential scan (PostgreSQL 17, CI).
// A test that is not parallel runs to its end before any parallel one resumes.
func TestWarnedGenerationPlans(t *testing.T) {
	onPostgres(t, func(t *testing.T, b *testBundle) {
		t.Cleanup(func() {
			require.NoError(t, b.db.Exec("DELETE FROM operations WHERE tenant_id = ? AND key = 'lock'", b.p.TenantID).Error)
			require.NoError(t, b.db.Exec("DELETE FROM idem_keys WHERE tenant_id = ? AND key = 'lock'", b.p.TenantID).Error)
			require.NoError(t, b.db.Exec("ANALYZE operations").Error)
		})
		var keyID int64
		require.NoError(t, b.db.Raw(`INSERT INTO idem_keys (tenant_id, key, fencing_token, last_operation_id, acquired_at)
VALUES (?, 'lock', 20000, gen_random_uuid(), now()) RETURNING id`, b.p.TenantID).Scan(&keyID).Error)
		require.NoError(t, b.db.Exec(`INSERT INTO operations (id, tenant_id, key, key_id, state, fencing_token, owner_token_hash,
  acquired_at, expires_at, ended_at)
SELECT gen_random_uuid(), ?, 'lock', ?, CASE WHEN g = 1 THEN 'uncertain' ELSE 'released' END, g, 'plan',
       now(), now() + interval '1 minute', CASE WHEN g > 1 THEN now() END
  FROM generate_series(1, 20000) g`, b.p.TenantID, keyID).Error)
		require.NoError(t, b.db.Exec("ANALYZE operations").Error)

		dry := b.db.Session(&gorm.Session{DryRun: true})
		var op models.Operation
		st := warnedGeneration(dry, keyID, 20001).Take(&op).Statement
		queries := map[string][]any{
			"warnedGeneration": append([]any{st.SQL.String()}, st.Vars...),
			// idemgate_acquire's and idemgate_webhook_admitted's, as written there.
			"idemgate_acquire": {`SELECT * FROM operations o WHERE o.key_id = ? AND o.fencing_token <= ?
  AND idemgate_may_duplicate_effect(o.state) ORDER BY o.fencing_token DESC LIMIT 1`, keyID, 20000},
			// idemgate_admitted_possible_duplicate's.
			"possible_duplicate": {`SELECT (SELECT e.fencing_token FROM operations e WHERE e.key_id = ?
  AND e.fencing_token < ? AND idemgate_may_duplicate_effect(e.state)
  ORDER BY e.fencing_token DESC LIMIT 1) IS NOT NULL`, keyID, 20001},
		}
		for name, q := range queries {
			var lines []string
			require.NoError(t, b.db.Raw("EXPLAIN "+q[0].(string), q[1:]...).Scan(&lines).Error)
			p := strings.Join(lines, "\n")
			require.Contains(t, p, "operations_effect", "%s:\n%s", name, p)
		}
	})
}
