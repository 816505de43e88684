package services

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
)

// The reaper works on every tenant of the package database, so these tests do not run in
// parallel with others (parallel tests start only after all sequential ones have finished), and
// each first drains what earlier tests left behind so that its counts are exact.
//
// drain reaps until no hold of any tenant expires within the next two seconds, so holds that
// earlier tests left behind cannot expire during the test and skew its counts. It gives up when
// 5 seconds pass without a pass that expired anything, not 5 seconds in all: a backlog of
// short-TTL holds from earlier tests took a pass of one transaction per hold (before
// reapTxBatch), which on SQLite under -race on a loaded machine ran past a fixed 5 seconds
// ("162 holds keep expiring", with the reaper still at work). A bound in all (two minutes)
// remains for a test that left something acquiring.
func drain(t *testing.T, b *testBundle) {
	t.Helper()
	giveUp := time.Now().Add(2 * time.Minute)
	for stalled := time.Now().Add(5 * time.Second); ; {
		res, err := b.reaper.RunOnce(bg)
		require.NoError(t, err)
		if res.HoldsExpired > 0 || res.MarkedUncertain > 0 {
			stalled = time.Now().Add(5 * time.Second)
		}
		now, err := b.db.Now(bg, b.db.DB)
		require.NoError(t, err)
		var soon, lapsing int64
		require.NoError(t, b.db.Model(&models.IdemKey{}).
			Where("holder_operation_id IS NOT NULL AND expires_at <= ?", now.Add(2*time.Second)).Count(&soon).Error)
		// Leases too: another test's in-progress operation whose lease lapses (a lease shorter
		// than its TTL) is made uncertain by the next pass, whoever runs it.
		require.NoError(t, b.db.Model(&models.Operation{}).
			Where("state = ? AND lease_expires_at <= ?", StateInProgress, now.Add(2*time.Second)).Count(&lapsing).Error)
		soon += lapsing
		if soon == 0 {
			return
		}
		require.True(t, time.Now().Before(stalled) && time.Now().Before(giveUp), "%d holds keep expiring", soon)
		time.Sleep(200 * time.Millisecond)
	}
}

func TestReaperExpiresHolds(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		drain(t, b)
		inProgress := mustAcquire(t, b, "reap-in-progress", 1)
		succeeded := mustAcquire(t, b, "reap-succeeded", 1)
		mustRecord(t, b, succeeded, OutcomeInput{Status: StateSucceeded, Receipt: ptr("r")})
		failed := mustAcquire(t, b, "reap-failed", 1)
		mustRecord(t, b, failed, OutcomeInput{Status: StateFailed})
		uncertain := mustAcquire(t, b, "reap-uncertain", 1)
		mustRecord(t, b, uncertain, OutcomeInput{Status: StateUncertain, Receipt: ptr("u")})
		live := mustAcquire(t, b, "reap-live", 60)
		released := mustAcquire(t, b, "reap-released", 1)
		_, err := release(b, released)
		require.NoError(t, err)
		b.elapse(t, time.Second)

		before := map[string]opState{}
		for _, a := range []*Acquisition{succeeded, failed, uncertain, live, released} {
			before[a.OperationID] = snapshot(t, b, a.OperationID)
		}

		res, err := b.reaper.RunOnce(bg)
		require.NoError(t, err)
		require.EqualValues(t, 4, res.HoldsExpired) // in_progress, succeeded, failed, uncertain
		require.EqualValues(t, 1, res.MarkedUncertain)

		// The in_progress operation became uncertain with the reason and one system event.
		d, err := b.reads.GetOperation(bg, b.p.TenantID, inProgress.OperationID)
		require.NoError(t, err)
		require.Equal(t, StateUncertain, d.State)
		require.Equal(t, ReasonTTLExpired, deref(d.StateReason))
		require.Nil(t, d.Outcome)
		require.False(t, d.Held)
		require.Len(t, d.Events, 1)
		require.Equal(t, Event{Kind: EventStateChanged, Actor: ActorSystem, Detail: "in_progress -> uncertain: " + ReasonTTLExpired,
			CreatedAt: d.Events[0].CreatedAt}, d.Events[0])
		row := keyRow(t, b, "reap-in-progress")
		require.Nil(t, row.HolderOperationID)
		require.Nil(t, row.ExpiresAt)
		require.Equal(t, inProgress.OperationID, row.LastOperationID)

		// Operations with an outcome keep their state; only the expired hold is cleared.
		for _, a := range []*Acquisition{succeeded, failed, uncertain} {
			after := snapshot(t, b, a.OperationID)
			require.Nil(t, after.Key.HolderOperationID, a.Key)
			require.Nil(t, after.Key.ExpiresAt, a.Key)
			require.Equal(t, before[a.OperationID].Op, after.Op, a.Key)
			require.Equal(t, before[a.OperationID].Events, after.Events, a.Key)
		}
		require.Equal(t, StateSucceeded, opRow(t, b, succeeded.OperationID).State)
		// The live hold and the released key are untouched.
		require.Equal(t, before[live.OperationID], snapshot(t, b, live.OperationID))
		require.Equal(t, before[released.OperationID], snapshot(t, b, released.OperationID))
		k, err := b.reads.GetKey(bg, b.p.TenantID, "reap-live")
		require.NoError(t, err)
		require.True(t, k.Held)

		// A second pass finds nothing to do.
		res, err = b.reaper.RunOnce(bg)
		require.NoError(t, err)
		require.Zero(t, res.HoldsExpired)
		require.Zero(t, res.MarkedUncertain)

		// The reaped uncertain operation can be reconciled, and the key admits again.
		op := mustRecord(t, b, inProgress, OutcomeInput{Status: StateFailed, Receipt: ptr("checked")})
		require.Equal(t, StateFailed, op.State)
		next := mustAcquire(t, b, "reap-in-progress", 60)
		require.EqualValues(t, 2, next.FencingToken)
		next = mustAcquire(t, b, "reap-uncertain", 60)
		require.EqualValues(t, 2, next.FencingToken)
		require.Equal(t, StateUncertain, next.PreviousOperation.State)
	})
}

// docs/reference.md §1.3 and §6: the reaper clears a hold only by compare on its operation, so a key
// re-acquired between the reaper's scan and its update keeps the new hold; and an outcome
// recorded in between keeps its state (the hold, still that operation's and expired, is cleared).
func TestReaperCompareOnOwner(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		drain(t, b)
		old := mustAcquire(t, b, "reap-race", 1)
		recorded := mustAcquire(t, b, "reap-outcome-race", 1)
		b.elapse(t, time.Second)

		r := NewReaper(b.db, slog.New(slog.NewTextHandler(io.Discard, nil)), 0)
		var fresh *Acquisition
		calls := 0
		r.afterScan = func() {
			calls++
			if fresh == nil {
				fresh = mustAcquire(t, b, "reap-race", 60)
				mustRecord(t, b, recorded, OutcomeInput{Status: StateSucceeded, Receipt: ptr("just in time")})
			}
		}
		res, err := r.RunOnce(bg)
		require.NoError(t, err)
		require.Equal(t, 1, calls)
		require.NotNil(t, fresh)
		require.EqualValues(t, 2, fresh.FencingToken)
		require.EqualValues(t, 1, res.HoldsExpired) // reap-outcome-race only
		require.Zero(t, res.MarkedUncertain)

		k, err := b.reads.GetKey(bg, b.p.TenantID, "reap-race")
		require.NoError(t, err)
		require.True(t, k.Held)
		require.Equal(t, fresh.OperationID, k.Operation.ID)
		require.Equal(t, StateInProgress, k.Operation.State)
		require.Equal(t, fresh.OperationID, deref(keyRow(t, b, "reap-race").HolderOperationID))

		// The takeover marked the old operation uncertain exactly once; the reaper added nothing.
		d, err := b.reads.GetOperation(bg, b.p.TenantID, old.OperationID)
		require.NoError(t, err)
		require.Equal(t, StateUncertain, d.State)
		require.Len(t, d.Events, 1)

		m := opRow(t, b, recorded.OperationID)
		require.Equal(t, StateSucceeded, m.State)
		require.Nil(t, m.StateReason)
		require.Nil(t, keyRow(t, b, "reap-outcome-race").HolderOperationID)

		// And the new holder can still release it.
		op, err := release(b, fresh)
		require.NoError(t, err)
		require.Equal(t, StateReleased, op.State)
	})
}

// docs/reference.md §6: evidence is purged retention after the operation ended; uncertain, unfinished and
// still-held operations are kept.
func TestReaperRetention(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		drain(t, b)
		// Ended and old: a released operation with a duplicate attempt, and a failed+released one.
		rel := mustAcquire(t, b, "ret-released", 60)
		_, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "ret-released", TTLSeconds: 60})
		require.NoError(t, err)
		_, err = release(b, rel)
		require.NoError(t, err)
		failRel := mustAcquire(t, b, "ret-failed-released", 60)
		mustRecord(t, b, failRel, OutcomeInput{Status: StateFailed, Release: true})
		// Ended and old but still holding its key: kept until the hold is gone.
		heldFailed := mustAcquire(t, b, "ret-held-failed", 60)
		mustRecord(t, b, heldFailed, OutcomeInput{Status: StateFailed})
		heldSucc := mustAcquire(t, b, "ret-held-succeeded", 60)
		mustRecord(t, b, heldSucc, OutcomeInput{Status: StateSucceeded})
		// Never ended: uncertain (recorded) and in_progress; acquired long ago makes no difference.
		unc := mustAcquire(t, b, "ret-uncertain", 60)
		mustRecord(t, b, unc, OutcomeInput{Status: StateUncertain})
		inProg := mustAcquire(t, b, "ret-in-progress", 60)
		// Ended recently: kept.
		recent := mustAcquire(t, b, "ret-recent", 60)
		_, err = release(b, recent)
		require.NoError(t, err)

		old := time.Now().UTC().Add(-DefaultRetention - time.Hour)
		for _, a := range []*Acquisition{rel, failRel, heldFailed, heldSucc, unc, inProg} {
			require.NoError(t, b.db.Model(&models.Operation{}).Where("id = ?", a.OperationID).
				Update("acquired_at", old).Error)
			require.NoError(t, b.db.Model(&models.Operation{}).Where("id = ? AND ended_at IS NOT NULL", a.OperationID).
				Update("ended_at", old).Error)
		}
		require.NotNil(t, opRow(t, b, heldFailed.OperationID).EndedAt)
		require.Nil(t, opRow(t, b, unc.OperationID).EndedAt)

		res, err := b.reaper.RunOnce(bg)
		require.NoError(t, err)
		require.EqualValues(t, 2, res.OperationsPurged)
		require.Zero(t, res.HoldsExpired)

		for _, a := range []*Acquisition{rel, failRel} {
			_, err := b.reads.GetOperation(bg, b.p.TenantID, a.OperationID)
			require.ErrorIs(t, err, ErrNotFound)
			var n int64
			require.NoError(t, b.db.Model(&models.Attempt{}).Where("operation_id = ?", a.OperationID).Count(&n).Error)
			require.Zero(t, n, "attempts of a purged operation")
			require.NoError(t, b.db.Model(&models.Event{}).Where("operation_id = ?", a.OperationID).Count(&n).Error)
			require.Zero(t, n, "events of a purged operation")
			// The key row stays, so fencing tokens keep increasing after a purge.
			k, err := b.reads.GetKey(bg, b.p.TenantID, a.Key)
			require.NoError(t, err)
			require.Nil(t, k.Operation)
			require.False(t, k.Held)
			next := mustAcquire(t, b, a.Key, 60)
			require.EqualValues(t, 2, next.FencingToken)
			require.Nil(t, next.PreviousOperation)
		}
		for _, a := range []*Acquisition{heldFailed, heldSucc, unc, inProg, recent} {
			d, err := b.reads.GetOperation(bg, b.p.TenantID, a.OperationID)
			require.NoError(t, err, a.Key)
			require.NotEmpty(t, d.Attempts, a.Key)
		}

		// Once the old failed operation no longer holds its key, it is purged too.
		_, err = release(b, heldFailed)
		require.NoError(t, err)
		require.NoError(t, b.db.Model(&models.Operation{}).Where("id = ?", heldFailed.OperationID).
			Update("ended_at", old).Error)
		res, err = b.reaper.RunOnce(bg)
		require.NoError(t, err)
		require.EqualValues(t, 1, res.OperationsPurged)
		_, err = b.reads.GetOperation(bg, b.p.TenantID, heldFailed.OperationID)
		require.ErrorIs(t, err, ErrNotFound)

		// A reaper with a short retention purges recently ended operations too.
		short := NewReaper(b.db, slog.New(slog.NewTextHandler(io.Discard, nil)), time.Millisecond)
		gone := mustAcquire(t, b, "ret-short", 60)
		_, err = release(b, gone)
		require.NoError(t, err)
		time.Sleep(20 * time.Millisecond)
		_, err = short.RunOnce(bg)
		require.NoError(t, err)
		_, err = b.reads.GetOperation(bg, b.p.TenantID, gone.OperationID)
		require.ErrorIs(t, err, ErrNotFound)
		_, err = b.reads.GetOperation(bg, b.p.TenantID, unc.OperationID)
		require.NoError(t, err, "uncertain operations are never purged")
		_, err = b.reads.GetOperation(bg, b.p.TenantID, inProg.OperationID)
		require.NoError(t, err)
	})
}
