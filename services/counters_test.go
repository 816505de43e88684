package services

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestKeptCountersMatchTheRows: after admissions, duplicates, conflicts, outcomes, releases,
// re-admissions and a purge, the kept counts (operation_state_counts + deltas) equal a count of
// the operations by state, and the kept attempt hours equal a count of the attempts by hour and
// result, before and after the reaper folds the deltas (models/sql/*/operation_state_counts.sql, counters.go).
func TestKeptCountersMatchTheRows(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		for i := 0; i < 30; i++ {
			key := fmt.Sprintf("count-%02d", i)
			acq := mustAcquire(t, b, key, 3600)
			_, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: key, TTLSeconds: 3600}) // duplicate
			require.NoError(t, err)
			if i%5 == 0 {
				_, err = b.adm.Acquire(bg, b.p, AcquireInput{Key: key, TTLSeconds: 3600, Fingerprint: strPtr("other")})
				require.Error(t, err) // conflict
			}
			switch i % 3 {
			case 0:
				_, err = record(b, acq, OutcomeInput{Status: StateSucceeded})
				require.NoError(t, err)
				expireHold(t, b, key)
				mustAcquire(t, b, key, 3600) // a re-admission after success
			case 1:
				_, err = record(b, acq, OutcomeInput{Status: StateFailed})
				require.NoError(t, err)
			}
		}
		check := func(when string) {
			t.Helper()
			require.Equal(t, countedStates(t, b), keptStates(t, b), "operation counts %s", when)
			require.Equal(t, countedHours(t, b), keptHours(t, b), "attempt hours %s", when)
		}
		check("before a fold")
		_, err := b.reaper.RunOnce(bg)
		require.NoError(t, err)
		check("after a fold")
		// A purge subtracts the purged operations; the hours keep counting their attempts.
		hours := keptHours(t, b)
		for i := 1; i < 30; i += 3 { // the failed ones: their holds lapse, then retention passes
			expireHold(t, b, fmt.Sprintf("count-%02d", i))
		}
		require.NoError(t, b.db.Exec("UPDATE operations SET ended_at = ? WHERE tenant_id = ? AND state = ?",
			time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), b.p.TenantID, StateFailed).Error)
		res, err := b.reaper.RunOnce(bg)
		require.NoError(t, err)
		require.Positive(t, res.OperationsPurged)
		require.Equal(t, countedStates(t, b), keptStates(t, b), "operation counts after a purge")
		require.Equal(t, hours, keptHours(t, b), "attempt hours after a purge")
	})
}

// TestPossibleDuplicateEffectFollowsTheRule: the flag the triggers keep on each operation equals
// the rule of AuditGroup (an earlier operation of the key is succeeded or uncertain), at
// admission and after an earlier operation's state changes.
func TestPossibleDuplicateEffectFollowsTheRule(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		first := mustAcquire(t, b, "flag-a", 3600)
		_, err := record(b, first, OutcomeInput{Status: StateSucceeded})
		require.NoError(t, err)
		expireHold(t, b, "flag-a")
		second := mustAcquire(t, b, "flag-a", 3600)
		require.True(t, flagOf(t, b, second.OperationID), "admitted after a succeeded operation")
		require.False(t, flagOf(t, b, first.OperationID), "the first admission of a key")

		other := mustAcquire(t, b, "flag-b", 3600)
		_, err = record(b, other, OutcomeInput{Status: StateFailed, Release: true})
		require.NoError(t, err)
		later := mustAcquire(t, b, "flag-b", 3600)
		require.False(t, flagOf(t, b, later.OperationID), "admitted after a failed operation")

		// The earlier operation's state moves out of {succeeded, uncertain} and back (as a
		// correction would): the later operation's flag follows it.
		require.NoError(t, b.db.Exec("UPDATE operations SET state = ? WHERE id = ?", StateFailed, first.OperationID).Error)
		require.False(t, flagOf(t, b, second.OperationID), "earlier operation now failed")
		require.NoError(t, b.db.Exec("UPDATE operations SET state = ? WHERE id = ?", StateUncertain, first.OperationID).Error)
		require.True(t, flagOf(t, b, second.OperationID), "earlier operation now uncertain")

		// Every operation of the tenant agrees with the rule evaluated from scratch.
		var rows []struct {
			ID   string
			Flag bool
			Rule bool
		}
		require.NoError(t, b.db.Raw(`SELECT l.id, l.possible_duplicate_effect AS flag,
  EXISTS (SELECT 1 FROM operations e WHERE e.key_id = l.key_id AND e.fencing_token < l.fencing_token
            AND e.state IN ('succeeded', 'uncertain')) AS rule
  FROM operations l WHERE l.tenant_id = ?`, b.p.TenantID).Scan(&rows).Error)
		require.Len(t, rows, 4)
		for _, r := range rows {
			require.Equal(t, r.Rule, r.Flag, r.ID)
		}
	})
}

func strPtr(s string) *string { return &s }

func flagOf(t *testing.T, b *testBundle, id string) bool {
	t.Helper()
	var flag bool
	require.NoError(t, b.db.Raw("SELECT possible_duplicate_effect FROM operations WHERE id = ?", id).Scan(&flag).Error)
	return flag
}

// countedStates counts the tenant's operations by state; keptStates reads the kept counts.
func countedStates(t *testing.T, b *testBundle) map[string]int64 {
	return stateCounts(t, b, "SELECT state, COUNT(*) AS n FROM operations WHERE tenant_id = ? GROUP BY state", b.p.TenantID)
}

func keptStates(t *testing.T, b *testBundle) map[string]int64 {
	return stateCounts(t, b, stateCountsSQL(true), b.p.TenantID, b.p.TenantID)
}

// stateCounts runs a query of (state, n) rows; states whose n is 0 are left out.
func stateCounts(t *testing.T, b *testBundle, sql string, args ...any) map[string]int64 {
	t.Helper()
	var rows []struct {
		State string
		N     int64
	}
	require.NoError(t, b.db.Raw(sql, args...).Scan(&rows).Error)
	out := map[string]int64{}
	for _, r := range rows {
		if r.N != 0 {
			out[r.State] = r.N
		}
	}
	return out
}

// countedHours counts the tenant's attempts by hour and result; keptHours reads the kept hours.
func countedHours(t *testing.T, b *testBundle) []string {
	return hourCounts(t, b, "SELECT "+newStore(b.db).hourOf("attempted_at")+" AS hour, result, COUNT(*) AS n FROM attempts WHERE tenant_id = ? GROUP BY 1, 2",
		b.p.TenantID)
}

func keptHours(t *testing.T, b *testBundle) []string {
	args := []any{"0000", "9999", b.p.TenantID}
	return hourCounts(t, b, attemptHoursSQL(true), append(args, args...)...)
}

// hourCounts runs a query of (hour, result, n) rows and returns them as sorted "hour result n"
// lines, leaving out those whose n is 0.
func hourCounts(t *testing.T, b *testBundle, sql string, args ...any) []string {
	t.Helper()
	var rows []struct {
		Hour   string
		Result string
		N      int64
	}
	require.NoError(t, b.db.Raw(sql, args...).Scan(&rows).Error)
	var out []string
	for _, r := range rows {
		if r.N != 0 {
			out = append(out, fmt.Sprintf("%s %s %d", r.Hour, r.Result, r.N))
		}
	}
	sort.Strings(out)
	return out
}
