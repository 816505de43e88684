package services

import (
	"context"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/models"
)

// OverviewStates lists the operation states in lifecycle order, the order the Overview shows
// them in (docs/reference.md §3).
var OverviewStates = []string{
	StateInProgress, StateUncertain, StateSucceeded, StateFailed, StateReleased,
}

// OverviewRange is the Overview chart's time range (docs/reference.md §5): Range24h, 24
// one-hour buckets, or Range7d, 28 six-hour buckets.
type OverviewRange string

// The Overview's ranges.
const (
	Range24h OverviewRange = "24h"
	Range7d  OverviewRange = "7d"
)

// buckets is the range's bucket width and count.
func (r OverviewRange) buckets() (time.Duration, int) {
	if r == Range7d {
		return 6 * time.Hour, 28
	}
	return time.Hour, 24
}

// ParseOverviewRange reads a range's name: "" (the default) or "24h", and "7d". Errors:
// ErrInvalidRequest (field "range").
func ParseOverviewRange(s string) (OverviewRange, error) {
	switch OverviewRange(s) {
	case "", Range24h:
		return Range24h, nil
	case Range7d:
		return Range7d, nil
	}
	return "", invalid(FieldError{Field: "range", Message: "must be 24h or 7d"})
}

// StateCount is the number of operations in one state.
type StateCount struct {
	State string
	Count int64
}

// HourBucket counts the acquire attempts of one chart bucket by result. Start is the bucket's
// first instant, UTC; it covers [Start, Start+Overview.Bucket): one hour, or six hours
// (starting at 00, 06, 12 or 18 UTC) for Range7d.
type HourBucket struct {
	Start      time.Time
	Admitted   int64
	Duplicates int64
	Conflicts  int64
}

// Overview is the dashboard's summary (docs/reference.md §5 "Overview"). Counts has one entry per state
// in OverviewStates order, zeros included. NeedsReconciliation is the number of operations
// in state uncertain. Hours has the range's buckets (24 of an hour, or 28 of six hours for
// Range7d), oldest first, the last one holding Now; Bucket is their width.
// Now is the database time the figures were read at. OldestUncertainAge is how long the
// oldest uncertain operation has been uncertain, at Now (0 when none is).
type Overview struct {
	Now                 time.Time
	Counts              []StateCount
	NeedsReconciliation int64
	OldestUncertainAge  time.Duration
	Hours               []HourBucket
	Bucket              time.Duration
}

// Overview returns the operation counts and the last 24 hours of attempts of one tenant, or
// of every tenant when tenantID is nil (a global dashboard account). Hours are judged by the
// database clock (docs/reference.md §6). Errors: ErrStoreUnavailable.
func (ds *Dashboard) Overview(ctx context.Context, tenantID *int64) (*Overview, error) {
	return ds.OverviewFor(ctx, tenantID, Range24h)
}

// OverviewFor is Overview with the chart over range r (Range24h or Range7d; anything else
// is taken as Range24h). Errors: ErrStoreUnavailable.
func (ds *Dashboard) OverviewFor(ctx context.Context, tenantID *int64, r OverviewRange) (*Overview, error) {
	tx := ds.db.WithContext(ctx)
	now, err := ds.db.Now(ctx, tx)
	if err != nil {
		return nil, storeError("overview", err)
	}
	ov := &Overview{Now: now}

	// Kept counts (counters.go), not a count of the operations: a few rows per tenant.
	var counts []struct {
		State string
		N     int64
	}
	var args []any
	if tenantID != nil {
		args = []any{*tenantID, *tenantID}
	}
	if err := tx.Raw(stateCountsSQL(tenantID != nil), args...).Scan(&counts).Error; err != nil {
		return nil, storeError("overview", err)
	}
	byState := map[string]int64{}
	for _, c := range counts {
		byState[c.State] = c.N
	}
	for _, s := range OverviewStates {
		ov.Counts = append(ov.Counts, StateCount{State: s, Count: byState[s]})
	}
	ov.NeedsReconciliation = byState[StateUncertain]
	if ov.NeedsReconciliation > 0 {
		// The oldest is the first entry of the queue's partial index (tenant_id, uncertain_at).
		var oldest struct{ T dbTime }
		oq := tx.Model(&models.Operation{}).Select("MIN(uncertain_at) AS t").Where("state = ?", StateUncertain)
		if tenantID != nil {
			oq = oq.Where("tenant_id = ?", *tenantID)
		}
		if err := oq.Scan(&oldest).Error; err != nil {
			return nil, storeError("overview", err)
		}
		ov.OldestUncertainAge = ageAt(now, oldest.T.T)
	}

	// Truncate counts from the zero time, a UTC midnight, so six-hour buckets start at 00, 06,
	// 12 and 18 UTC.
	width, n := r.buckets()
	ov.Bucket = width
	first := now.UTC().Truncate(width).Add(-time.Duration(n-1) * width)
	ov.Hours = make([]HourBucket, n)
	for i := range ov.Hours {
		ov.Hours[i].Start = first.Add(time.Duration(i) * width)
	}
	// Kept per-hour counts (counters.go): at most 24×3 rows (168×3 over 7 days) per tenant
	// however busy the range was; hours are folded into wider buckets below.
	var rows []struct {
		Hour   string
		Result string
		N      int64
	}
	hargs := []any{hourKey(first), hourKey(first.Add(time.Duration(n) * width))}
	if tenantID != nil {
		hargs = append(hargs, *tenantID)
	}
	if err := tx.Raw(attemptHoursSQL(tenantID != nil), append(hargs, hargs...)...).Scan(&rows).Error; err != nil {
		return nil, storeError("overview", err)
	}
	for _, r := range rows {
		h, err := time.ParseInLocation("2006-01-02 15", r.Hour, time.UTC)
		if err != nil {
			return nil, storeError("overview", fmt.Errorf("unexpected attempt hour %q: %w", r.Hour, err))
		}
		i := int(h.Sub(first) / width)
		if h.Before(first) || i >= n {
			continue
		}
		switch r.Result {
		case ResultAdmitted:
			ov.Hours[i].Admitted += r.N
		case ResultDuplicate:
			ov.Hours[i].Duplicates += r.N
		case ResultConflict:
			ov.Hours[i].Conflicts += r.N
		}
	}
	return ov, nil
}

// TenantCount is a number of operations of one tenant, by the tenant's name.
// OldestUncertainAge, for NeedsReconciliationByTenant, is how long the tenant's oldest
// uncertain operation has been uncertain (0 when none is).
type TenantCount struct {
	Tenant             string
	Count              int64
	OldestUncertainAge time.Duration
}

// ageAt is now - since, never negative (clocks of two instances may disagree a little), and
// 0 for a zero since.
func ageAt(now, since time.Time) time.Duration {
	if since.IsZero() || !now.After(since) {
		return 0
	}
	return now.Sub(since)
}

// NeedsReconciliationByTenant returns, for every tenant, the number of its operations in state
// uncertain (docs/reference.md §3 "needs reconciliation"), zeros included, ordered by tenant name. It is
// for metrics: one statement whose cost grows with the number of tenants only (kept counts,
// models/sql/*/operation_state_counts.sql). Errors: ErrStoreUnavailable.
//
// The same statement reads each tenant's oldest uncertain_at (the first entry of the partial
// index operations_uncertain_queue), so the oldest-uncertain gauge costs nothing extra; ages
// are judged by the database clock.
func (ds *Dashboard) NeedsReconciliationByTenant(ctx context.Context) ([]TenantCount, error) {
	tx := ds.db.WithContext(ctx)
	now, err := ds.db.Now(ctx, tx)
	if err != nil {
		return nil, storeError("count operations needing reconciliation", err)
	}
	var rows []struct {
		Tenant string
		Count  int64
		Oldest dbTime
	}
	// Per tenant: the kept count (counters.go) and the first entry of the queue's partial
	// index (tenant_id, uncertain_at), so a scrape reads a few rows per tenant however many
	// operations are uncertain.
	err = tx.Raw(`SELECT t.name AS tenant,
       COALESCE((SELECT SUM(n) FROM (
           SELECT n FROM operation_state_counts c WHERE c.tenant_id = t.id AND c.state = ?
           UNION ALL
           SELECT n FROM operation_state_deltas d WHERE d.tenant_id = t.id AND d.state = ?) u), 0) AS count,
       (SELECT MIN(o.uncertain_at) FROM operations o WHERE o.state = ? AND o.tenant_id = t.id) AS oldest
  FROM tenants t
 ORDER BY t.name`, StateUncertain, StateUncertain, StateUncertain).Scan(&rows).Error
	if err != nil {
		return nil, storeError("count operations needing reconciliation", err)
	}
	out := make([]TenantCount, 0, len(rows))
	for _, r := range rows {
		out = append(out, TenantCount{Tenant: r.Tenant, Count: r.Count, OldestUncertainAge: ageAt(now, r.Oldest.T)})
	}
	return out, nil
}
