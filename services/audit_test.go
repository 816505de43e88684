package services

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
)

func TestAuditGroupsAndFlags(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		start := time.Now().UTC().Add(-time.Minute)
		// "busy": two duplicates and one conflict of one hold.
		in := AcquireInput{Key: "busy", TTLSeconds: 60, Fingerprint: ptr("a")}
		_, err := b.adm.Acquire(bg, b.p, in)
		require.NoError(t, err)
		for range 2 {
			_, err = b.adm.Acquire(bg, b.p, in)
			require.NoError(t, err)
		}
		_, err = b.adm.Acquire(bg, b.p, AcquireInput{Key: "busy", TTLSeconds: 60, Fingerprint: ptr("b")})
		require.ErrorIs(t, err, ErrFingerprintMismatch)
		// "again": succeeded, then admitted again after its TTL, then a duplicate.
		first := mustAcquire(t, b, "again", 1)
		mustRecord(t, b, first, OutcomeInput{Status: StateSucceeded})
		b.elapse(t, time.Second)
		mustAcquire(t, b, "again", 60)
		_, err = b.adm.Acquire(bg, b.p, AcquireInput{Key: "again", TTLSeconds: 60})
		require.NoError(t, err)
		// "quiet": admitted only, so not in the audit.
		mustAcquire(t, b, "quiet", 60)
		// Another tenant's duplicate stays out of this tenant's audit.
		other := otherTenant(t, b)
		for range 3 { // admitted, then two duplicates
			_, err = b.adm.Acquire(bg, other, AcquireInput{Key: "busy", TTLSeconds: 60})
			require.NoError(t, err)
		}

		rep, err := b.audit.Report(bg, &b.p.TenantID, AuditFilter{})
		require.NoError(t, err)
		require.False(t, rep.Truncated)
		require.Equal(t, DefaultAuditSpan, rep.Filter.To.Sub(rep.Filter.From))
		require.Len(t, rep.Groups, 2)
		g := rep.Groups[0] // most recent last attempt first
		require.Equal(t, "again", g.Key)
		require.EqualValues(t, 1, g.Duplicates)
		require.Zero(t, g.Conflicts)
		require.True(t, g.PossibleDuplicateEffect)
		require.Equal(t, g.FirstAt, g.LastAt)
		g = rep.Groups[1]
		require.Equal(t, "busy", g.Key)
		require.Equal(t, b.p.TenantID, g.TenantID)
		require.NotEmpty(t, g.TenantName)
		require.EqualValues(t, 2, g.Duplicates)
		require.EqualValues(t, 1, g.Conflicts)
		require.False(t, g.PossibleDuplicateEffect)
		require.True(t, g.FirstAt.Before(g.LastAt))
		require.True(t, g.FirstAt.After(start), "%v after %v", g.FirstAt, start)
		require.Equal(t, time.UTC, g.FirstAt.Location())

		// Filter by tenant name: the own tenant's name matches, another one empties the report.
		named, err := b.audit.Report(bg, &b.p.TenantID, AuditFilter{Tenant: g.TenantName})
		require.NoError(t, err)
		require.Len(t, named.Groups, 2)
		var otherName string
		require.NoError(t, b.db.Model(&models.Tenant{}).Where("id = ?", other.TenantID).Pluck("name", &otherName).Error)
		none, err := b.audit.Report(bg, &b.p.TenantID, AuditFilter{Tenant: otherName})
		require.NoError(t, err)
		require.Empty(t, none.Groups)
		global, err := b.audit.Report(bg, nil, AuditFilter{Tenant: otherName})
		require.NoError(t, err)
		require.Len(t, global.Groups, 1)
		require.EqualValues(t, 2, global.Groups[0].Duplicates)

		// A range that ended before the attempts holds none of them.
		old, err := b.audit.Report(bg, &b.p.TenantID, AuditFilter{From: start.Add(-2 * time.Hour), To: start})
		require.NoError(t, err)
		require.Empty(t, old.Groups)

		// The export streams one row per duplicate or conflicting attempt, and the admission
		// that was a possible duplicate effect, oldest first.
		var rows []AuditRow
		require.NoError(t, b.audit.Attempts(bg, &b.p.TenantID, AuditFilter{}, 0, func(r AuditRow) error {
			rows = append(rows, r)
			return nil
		}))
		require.Len(t, rows, 5)
		require.Equal(t, []string{"duplicate", "duplicate", "conflict", "admitted", "duplicate"},
			[]string{rows[0].Result, rows[1].Result, rows[2].Result, rows[3].Result, rows[4].Result})
		require.Equal(t, []bool{false, false, false, true, true}, []bool{rows[0].PossibleDuplicateEffect,
			rows[1].PossibleDuplicateEffect, rows[2].PossibleDuplicateEffect, rows[3].PossibleDuplicateEffect,
			rows[4].PossibleDuplicateEffect})
		require.Equal(t, "busy", rows[0].Key)
		require.Equal(t, "again", rows[3].Key)
		require.Equal(t, "again", rows[4].Key)
		require.Equal(t, b.p.Prefix, rows[0].Caller)
		require.Equal(t, "a", rows[0].Fingerprint)
		require.NotEmpty(t, rows[0].OperationID)
		require.Equal(t, g.TenantName, rows[0].TenantName)
		for i := 1; i < len(rows); i++ {
			require.False(t, rows[i].AttemptedAt.Before(rows[i-1].AttemptedAt))
		}

		// An error from fn stops the export.
		stop := errors.New("stop")
		n := 0
		err = b.audit.Attempts(bg, &b.p.TenantID, AuditFilter{}, 0, func(AuditRow) error { n++; return stop })
		require.ErrorIs(t, err, stop)
		require.Equal(t, 1, n)
	})
}

func TestAuditRejectsBadRanges(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		now := time.Now().UTC()
		for name, f := range map[string]AuditFilter{
			"to before from": {From: now, To: now.Add(-time.Hour)},
			"empty range":    {From: now, To: now},
			"over 31 days":   {From: now.Add(-MaxAuditSpan - time.Second), To: now},
		} {
			_, err := b.audit.Report(bg, &b.p.TenantID, f)
			require.ErrorIs(t, err, ErrInvalidRequest, name)
			err = b.audit.Attempts(bg, &b.p.TenantID, f, 0, func(AuditRow) error { return nil })
			require.ErrorIs(t, err, ErrInvalidRequest, name)
		}
		rep, err := b.audit.Report(bg, &b.p.TenantID, AuditFilter{From: now.Add(-MaxAuditSpan), To: now})
		require.NoError(t, err)
		require.Empty(t, rep.Groups)
	})
}

// TestAuditPossibleDuplicateEffect: an operation admitted while an earlier operation of its
// key had succeeded ("resold") or was uncertain ("lost", "reaped") is audited with no
// duplicate or conflicting attempt at all, linked to that operation; an earlier operation that
// failed ("failed") or was released ("released") flags nothing, and reconciling an uncertain
// one as failed ("cleared") clears the flag, as the effect is then known not to have happened.
func TestAuditPossibleDuplicateEffect(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		first := map[string]*Acquisition{}
		for _, k := range []string{"resold", "lost", "reaped", "failed", "released", "cleared"} {
			first[k] = mustAcquire(t, b, k, 1)
		}
		mustRecord(t, b, first["resold"], OutcomeInput{Status: StateSucceeded})
		mustRecord(t, b, first["failed"], OutcomeInput{Status: StateFailed})
		mustRecord(t, b, first["released"], OutcomeInput{Status: StateFailed, Release: true})
		b.elapse(t, time.Second)
		second := map[string]*Acquisition{"lost": mustAcquire(t, b, "lost", 60)} // uncertain by the takeover
		_, err := b.reaper.RunOnce(bg)                                           // "reaped" and "cleared" by the reaper
		require.NoError(t, err)
		mustRecord(t, b, first["cleared"], OutcomeInput{Status: StateFailed})
		for k := range first {
			if second[k] == nil {
				second[k] = mustAcquire(t, b, k, 60)
			}
		}

		rep, err := b.audit.Report(bg, &b.p.TenantID, AuditFilter{})
		require.NoError(t, err)
		got := map[string]AuditGroup{}
		for _, g := range rep.Groups {
			got[g.Key] = g
		}
		require.Len(t, got, 3, "%+v", rep.Groups)
		for _, k := range []string{"resold", "lost", "reaped"} {
			g := got[k]
			require.True(t, g.PossibleDuplicateEffect, k)
			require.Equal(t, second[k].OperationID, g.OperationID, k)
			require.Zero(t, g.Duplicates+g.Conflicts, k)
			require.False(t, g.FirstAt.IsZero(), k)
		}

		var rows []AuditRow
		require.NoError(t, b.audit.Attempts(bg, &b.p.TenantID, AuditFilter{}, 0, func(r AuditRow) error {
			rows = append(rows, r)
			return nil
		}))
		require.Len(t, rows, 3)
		for _, r := range rows {
			require.Equal(t, ResultAdmitted, r.Result)
			require.Equal(t, second[r.Key].OperationID, r.OperationID)
			require.True(t, r.PossibleDuplicateEffect)
		}

		// The detail page's warning names the earlier operation, and only on the later one.
		acct := &OperatorAccount{Username: "auditor", Role: RoleAuditor, TenantID: &b.p.TenantID}
		for k := range first {
			d, err := b.dash.OperationForOperator(bg, acct, second[k].OperationID)
			require.NoError(t, err)
			var ids []string
			for _, g := range d.PossibleDuplicateOf {
				ids = append(ids, g.ID)
			}
			if k == "resold" || k == "lost" || k == "reaped" {
				require.Equal(t, []string{first[k].OperationID}, ids, k)
			} else {
				require.Empty(t, ids, k)
			}
			d, err = b.dash.OperationForOperator(bg, acct, first[k].OperationID)
			require.NoError(t, err)
			require.Empty(t, d.PossibleDuplicateOf, k)
		}
	})
}

// TestAuditExportPagesThroughEveryRow: the export reads in batches of AuditExportBatch; across
// batch boundaries every attempt comes exactly once, oldest first and, at one time, in the order
// logged (the keyset is (attempted_at, id)), and fn is called between batches (so it never runs
// while a query holds a connection).
func TestAuditExportPagesThroughEveryRow(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		now := time.Now().UTC().Truncate(time.Microsecond).Add(-time.Minute)
		const n = 2*AuditExportBatch + 7
		rows := make([]models.Attempt, 0, n)
		for i := 0; i < n; i++ {
			rows = append(rows, models.Attempt{TenantID: b.p.TenantID, Key: fmt.Sprintf("page-%04d", i),
				Result: ResultDuplicate, Caller: "idg_test", AttemptedAt: now.Add(time.Duration(i%3) * time.Microsecond)})
		}
		require.NoError(t, b.db.CreateInBatches(rows, 200).Error)
		var keys []string
		require.NoError(t, b.audit.Attempts(bg, &b.p.TenantID, AuditFilter{}, time.Minute, func(r AuditRow) error {
			keys = append(keys, r.Key)
			return nil
		}))
		require.Len(t, keys, n)
		var want []string
		for m := 0; m < 3; m++ { // the three times, oldest first; logged order within each
			for i := m; i < n; i += 3 {
				want = append(want, fmt.Sprintf("page-%04d", i))
			}
		}
		require.Equal(t, want, keys)
	})
}

// The Audit page walks the range newest first only until it has seen one key more than a page
// holds, then reads its keys' counts over the whole range: "early" has two duplicates older
// than everything the walk reads and one newer, and all three are counted.
func TestAuditPageCountsWhatItsWalkDidNotRead(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		early := AcquireInput{Key: "early", TTLSeconds: 600}
		for range 3 { // admitted, then two duplicates
			_, err := b.adm.Acquire(bg, b.p, early)
			require.NoError(t, err)
		}
		const n = MaxAuditGroups + 1
		many := make([]AcquireInput, n)
		for i := range many {
			many[i] = AcquireInput{Key: fmt.Sprintf("many:%03d", i), TTLSeconds: 600}
		}
		for range 3 { // admitted, then two duplicates each: more rows than one walk statement reads
			for _, part := range [][]AcquireInput{many[:300], many[300:]} {
				out, err := b.adm.AcquireBatch(bg, b.p, part)
				require.NoError(t, err)
				for _, it := range out {
					require.NoError(t, it.Err)
				}
			}
		}
		_, err := b.adm.Acquire(bg, b.p, early) // the newest duplicate of all
		require.NoError(t, err)

		rep, err := b.audit.Report(bg, &b.p.TenantID, AuditFilter{})
		require.NoError(t, err)
		require.True(t, rep.Truncated, "more keys than a page")
		require.Len(t, rep.Groups, MaxAuditGroups)
		g := rep.Groups[0]
		require.Equal(t, "early", g.Key)
		require.EqualValues(t, 3, g.Duplicates)
		require.True(t, g.FirstAt.Before(g.LastAt))
		for _, g := range rep.Groups[1:] {
			require.EqualValues(t, 2, g.Duplicates, g.Key)
			require.True(t, !g.LastAt.After(rep.Groups[0].LastAt))
		}
	})
}
