package services

import (
	"time"

	"gorm.io/gorm"
)

// The Overview's figures are kept, not counted (models/sql/*/operation_state_counts.sql): operation_state_counts holds
// the number of operations per (tenant, state) and attempt_hours the attempts per (tenant, UTC
// hour, result). On PostgreSQL the writers' triggers append to operation_state_deltas and
// attempt_hour_deltas, which take no lock anyone waits for, and foldCounters adds the deltas to
// the totals; on SQLite the triggers add to the totals directly and the delta tables stay empty.
// Readers add totals and deltas in one statement, so a figure is exact whether or not the
// deltas were folded yet.

// attemptHoursKept is how long attempt_hours keeps an hour: the Overview's longest chart is 7
// days; one more day covers hours that straddle the cutoff and clocks a little apart.
const attemptHoursKept = 8 * 24 * time.Hour

// counterFoldLock is the PostgreSQL advisory lock a fold holds for its transaction, so that
// the reapers of several instances take turns instead of queueing on the totals' rows.
const counterFoldLock = 0x1de3_6a7e_0c0f

// stateCountsSQL is the number of operations per state, totals and unfolded deltas added, for
// one tenant ("WHERE tenant_id = ?" in both halves, tenant given twice) or every tenant.
func stateCountsSQL(tenant bool) string {
	where := ""
	if tenant {
		where = " WHERE tenant_id = ?"
	}
	return `SELECT state, SUM(n) AS n FROM (
  SELECT state, n FROM operation_state_counts` + where + `
  UNION ALL
  SELECT state, n FROM operation_state_deltas` + where + `) c
GROUP BY state`
}

// attemptHoursSQL is the number of attempts per (hour, result) in [from hour, to hour), totals
// and unfolded deltas added, for one tenant or every tenant. Arguments: from, to, [tenant],
// from, to, [tenant].
func attemptHoursSQL(tenant bool) string {
	where := " WHERE hour >= ? AND hour < ?"
	if tenant {
		where += " AND tenant_id = ?"
	}
	return `SELECT hour, result, SUM(n) AS n FROM (
  SELECT hour, result, n FROM attempt_hours` + where + `
  UNION ALL
  SELECT hour, result, n FROM attempt_hour_deltas` + where + `) c
GROUP BY hour, result`
}

// hourKey is t's UTC hour in the text form attempt_hours stores ("2006-01-02 15").
func hourKey(t time.Time) string { return t.UTC().Format("2006-01-02 15") }

// foldCounters adds the counters' deltas into their totals and drops attempt hours older than
// attemptHoursKept before now, in one transaction: a reader sees the deltas or the totals they
// went into, never both or neither. On PostgreSQL a fold already running in another instance
// makes this one return at once (its deltas wait for the next pass). Errors: the database's.
func foldCounters(tx *gorm.DB, postgres bool, now time.Time) error {
	if postgres {
		var got bool
		if err := tx.Raw("SELECT pg_try_advisory_xact_lock(?)", counterFoldLock).Scan(&got).Error; err != nil {
			return err
		}
		if !got {
			return nil
		}
		// DELETE … RETURNING feeds the upsert in the same statement; rows appended after its
		// snapshot stay for the next fold. ORDER BY makes every fold lock the totals' rows in
		// one order.
		res := tx.Exec(`WITH d AS (DELETE FROM operation_state_deltas RETURNING tenant_id, state, n)
INSERT INTO operation_state_counts (tenant_id, state, n)
SELECT tenant_id, state, SUM(n) FROM d GROUP BY tenant_id, state ORDER BY tenant_id, state
ON CONFLICT (tenant_id, state) DO UPDATE SET n = operation_state_counts.n + EXCLUDED.n`)
		if res.Error != nil {
			return res.Error
		}
		res = tx.Exec(`WITH d AS (DELETE FROM attempt_hour_deltas RETURNING tenant_id, hour, result, n)
INSERT INTO attempt_hours (tenant_id, hour, result, n)
SELECT tenant_id, hour, result, SUM(n) FROM d GROUP BY tenant_id, hour, result ORDER BY tenant_id, hour, result
ON CONFLICT (tenant_id, hour, result) DO UPDATE SET n = attempt_hours.n + EXCLUDED.n`)
		if res.Error != nil {
			return res.Error
		}
	}
	return tx.Exec("DELETE FROM attempt_hours WHERE hour < ?", hourKey(now.Add(-attemptHoursKept))).Error
}
