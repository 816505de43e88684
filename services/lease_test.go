package services

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
)

// acquireLease acquires key with a lease shorter than its TTL and an expiry policy, and
// requires admission.
func acquireLease(t *testing.T, b *testBundle, key string, ttl, lease int64, policy string) *Acquisition {
	t.Helper()
	acq, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: key, TTLSeconds: ttl, LeaseSeconds: &lease, OnExpiry: &policy})
	require.NoError(t, err)
	require.True(t, acq.Admitted)
	require.Equal(t, policy, acq.OnExpiry)
	require.WithinDuration(t, acq.ExpiresAt.Add(-time.Duration(ttl-lease)*time.Second), acq.LeaseExpiresAt, time.Millisecond)
	return acq
}

// lapseLease moves operation id's lease end into the past, as if its holder stopped
// heartbeating long ago (the TTL stays as it is).
func lapseLease(t *testing.T, b *testBundle, id string) {
	t.Helper()
	require.NoError(t, b.db.Model(&models.Operation{}).Where("id = ?", id).
		Update("lease_expires_at", time.Now().UTC().Add(-2*time.Second)).Error)
}

// endTTL moves key's hold and its operation's TTL (and lease) into the past.
func endTTL(t *testing.T, b *testBundle, key, id string) {
	t.Helper()
	past := time.Now().UTC().Add(-time.Second)
	require.NoError(t, b.db.Model(&models.IdemKey{}).Where("tenant_id = ? AND key = ? AND holder_operation_id IS NOT NULL", b.p.TenantID, key).
		Update("expires_at", past).Error)
	require.NoError(t, b.db.Model(&models.Operation{}).Where("id = ?", id).
		Updates(map[string]any{"expires_at": past, "lease_expires_at": past.Add(-time.Second)}).Error)
}

// requireOutcomeUncertain requires err to be the 409 outcome_uncertain of an acquire, carrying
// operation id in state uncertain.
func requireOutcomeUncertain(t *testing.T, err error, id string) *Operation {
	t.Helper()
	var de *Error
	require.True(t, errors.As(err, &de), "want outcome_uncertain, got %v", err)
	require.Equal(t, CodeOutcomeUncertain, de.Code)
	require.NotNil(t, de.Operation)
	require.Equal(t, id, de.Operation.ID)
	require.Equal(t, StateUncertain, de.Operation.State)
	return de.Operation
}

func TestLeaseValidation(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		for _, c := range []struct {
			lease  int64
			policy string
			field  string
		}{{0, OnExpiryReadmit, "lease_seconds"}, {61, OnExpiryReadmit, "lease_seconds"}, {-1, OnExpiryHold, "lease_seconds"},
			{10, "forever", "on_expiry"}, {10, "", "on_expiry"}} {
			_, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "lease-invalid", TTLSeconds: 60, LeaseSeconds: &c.lease, OnExpiry: &c.policy})
			var de *Error
			require.True(t, errors.As(err, &de), "%+v", c)
			require.Equal(t, CodeInvalidRequest, de.Code)
			require.Equal(t, c.field, de.Fields[0].Field)
		}
		// Defaults: the lease is the TTL, the policy readmit.
		acq := mustAcquire(t, b, "lease-default", 60)
		require.Equal(t, acq.ExpiresAt, acq.LeaseExpiresAt)
		require.Equal(t, OnExpiryReadmit, acq.OnExpiry)
	})
}

// TestLeaseExpiredByReaper: the reaper makes an operation whose lease lapsed uncertain
// (lease_expired_without_outcome) while its key stays protected; a duplicate then gets 409
// outcome_uncertain with the operation, and after the TTL (readmit) a new attempt is admitted
// and told about it.
func TestLeaseExpiredByReaper(t *testing.T) {
	// Not parallel: its reaper passes would clear other tests' expired holds, which some
	// of them look at before clearing them themselves.
	eachDB(t, func(t *testing.T, b *testBundle) {
		acq := acquireLease(t, b, "lease/reaper", 600, 30, OnExpiryReadmit)
		lapseLease(t, b, acq.OperationID)
		// Other tests' reaper passes share the database, so this one's counts are not
		// asserted: the operation's own row is.
		res, err := b.reaper.RunOnce(bg)
		require.NoError(t, err)
		require.GreaterOrEqual(t, res.MarkedUncertain, int64(0))
		m := opRow(t, b, acq.OperationID)
		require.Equal(t, StateUncertain, m.State)
		require.Equal(t, ReasonLeaseExpired, deref(m.StateReason))
		require.Equal(t, acq.OperationID, deref(keyRow(t, b, "lease/reaper").HolderOperationID), "the key stays protected until its TTL")

		_, err = b.adm.Acquire(bg, b.p, AcquireInput{Key: "lease/reaper", TTLSeconds: 600})
		op := requireOutcomeUncertain(t, err, acq.OperationID)
		require.True(t, op.Held, "within its TTL the uncertain operation still holds the key")
		require.Equal(t, ReasonLeaseExpired, deref(op.StateReason))
		require.Equal(t, ResultDuplicate, newestAttemptResult(t, b, "lease/reaper"))

		endTTL(t, b, "lease/reaper", acq.OperationID)
		next := mustAcquire(t, b, "lease/reaper", 600)
		require.Equal(t, acq.FencingToken+1, next.FencingToken)
		require.NotNil(t, next.PreviousOperation)
		require.Equal(t, acq.OperationID, next.PreviousOperation.ID)
		require.Equal(t, StateUncertain, next.PreviousOperation.State)
	})
}

// TestLeaseExpiredOnDuplicate: without a reaper pass, the duplicate that finds the lapsed lease
// makes the operation uncertain in its own transaction, and is refused 409 outcome_uncertain,
// single and batched.
func TestLeaseExpiredOnDuplicate(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acq := acquireLease(t, b, "lease/dup", 600, 30, OnExpiryReadmit)
		other := acquireLease(t, b, "lease/dup-batch", 600, 30, OnExpiryReadmit)
		lapseLease(t, b, acq.OperationID)
		lapseLease(t, b, other.OperationID)

		_, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "lease/dup", TTLSeconds: 600})
		requireOutcomeUncertain(t, err, acq.OperationID)
		m := opRow(t, b, acq.OperationID)
		require.Equal(t, StateUncertain, m.State)
		require.Equal(t, ReasonLeaseExpired, deref(m.StateReason))
		var evs []models.Event
		require.NoError(t, b.db.Where("operation_id = ?", acq.OperationID).Order("id").Find(&evs).Error)
		require.Equal(t, "in_progress -> uncertain: "+ReasonLeaseExpired, evs[len(evs)-1].Detail)

		items, err := b.adm.AcquireBatch(bg, b.p, []AcquireInput{
			{Key: "lease/dup-batch", TTLSeconds: 600}, {Key: "lease/dup-batch", TTLSeconds: 600}, {Key: "lease/dup", TTLSeconds: 600}})
		require.NoError(t, err)
		requireOutcomeUncertain(t, items[0].Err, other.OperationID)
		requireOutcomeUncertain(t, items[1].Err, other.OperationID)
		requireOutcomeUncertain(t, items[2].Err, acq.OperationID)
		require.Equal(t, StateUncertain, opRow(t, b, other.OperationID).State)

		// A conflicting acquire is still a conflict: the holder's fingerprint is not revealed.
		_, err = b.adm.Acquire(bg, b.p, AcquireInput{Key: "lease/dup", TTLSeconds: 600, Fingerprint: ptr("other")})
		require.ErrorIs(t, err, ErrFingerprintMismatch)
	})
}

// TestRenewHeartbeatKeepsKey: a holder renewing a 10 s lease keeps its key well past its first
// lease; once it stalls, the lease lapses, its late renew is refused with lease_expired and
// changes nothing, and its late outcome still lands on its own operation (uncertain ->
// succeeded is reconciliation, docs/reference.md §3). Time passes heartbeatStep per heartbeat
// by b.elapse, so a heartbeat comes late only if a round takes longer than the rest of the
// lease in real time: with wall-clock pauses a 1 s lease did not fit a round under -race,
// twice, and a 3 s lease with 1 s steps (2 s to spare) not once under a loaded CI.
const (
	heartbeatLease = 10
	heartbeatStep  = 4 * time.Second
)

func TestRenewHeartbeatKeepsKey(t *testing.T) {
	// Not parallel: its reaper passes would clear other tests' expired holds, which some
	// of them look at before clearing them themselves.
	eachDB(t, func(t *testing.T, b *testBundle) {
		const key = "lease/heartbeat"
		acq := acquireLease(t, b, key, 60, heartbeatLease, OnExpiryReadmit)
		renew := func() (*Renewal, error) {
			return b.adm.Renew(bg, b.p, acq.OperationID, RenewInput{OwnerToken: acq.OwnerToken, LeaseSeconds: heartbeatLease})
		}
		// Heartbeat heartbeatStep apart until two first leases have passed, with reaper passes and
		// duplicates in between: the operation stays in_progress and held all along.
		var elapsed time.Duration
		for ; elapsed < 2*heartbeatLease*time.Second; elapsed += heartbeatStep {
			r, err := renew()
			require.NoError(t, err)
			require.Equal(t, acq.FencingToken, r.FencingToken)
			require.True(t, acq.ExpiresAt.Add(-elapsed).Equal(r.ExpiresAt),
				"the protection window does not move: %v, want %v", r.ExpiresAt, acq.ExpiresAt.Add(-elapsed))
			_, err = b.reaper.RunOnce(bg)
			require.NoError(t, err)
			dup, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: key, TTLSeconds: 60})
			require.NoError(t, err)
			require.False(t, dup.Admitted)
			require.Equal(t, StateInProgress, dup.Operation.State)
			b.elapse(t, heartbeatStep, key)
		}
		// The holder stalls: once a lease passes, the duplicate finds it lapsed.
		b.elapse(t, heartbeatLease*time.Second, key)
		_, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: key, TTLSeconds: 60})
		require.True(t, isCode(err, CodeOutcomeUncertain), "want outcome_uncertain, got %v", err)
		before := snapshot(t, b, acq.OperationID)
		_, err = renew()
		require.ErrorIs(t, err, ErrLeaseExpired)
		require.Equal(t, before.Op, snapshot(t, b, acq.OperationID).Op, "a late renew changes nothing")

		op := mustRecord(t, b, acq, OutcomeInput{Status: StateSucceeded, Receipt: ptr("late-receipt")})
		require.Equal(t, StateSucceeded, op.State)
		dup, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "lease/heartbeat", TTLSeconds: 60})
		require.NoError(t, err)
		require.Equal(t, acq.OperationID, dup.Operation.ID)
		require.Equal(t, "late-receipt", deref(dup.Operation.Outcome.Receipt))
	})
}

func TestRenewRefusals(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acq := acquireLease(t, b, "renew/refusals", 600, 10, OnExpiryReadmit)
		_, err := b.adm.Renew(bg, b.p, acq.OperationID, RenewInput{OwnerToken: "ot_wrong", LeaseSeconds: 0})
		require.ErrorIs(t, err, ErrNotOwner, "the owner token is checked first")
		_, err = b.adm.Renew(bg, b.p, "00000000-0000-0000-0000-000000000000", RenewInput{OwnerToken: acq.OwnerToken, LeaseSeconds: 5})
		require.ErrorIs(t, err, ErrNotFound)
		_, err = b.adm.Renew(bg, b.p, "not-a-uuid", RenewInput{OwnerToken: acq.OwnerToken, LeaseSeconds: 5})
		require.ErrorIs(t, err, ErrNotFound)
		other := b.p
		other.TenantID = b.p.TenantID + 100000
		_, err = b.adm.Renew(bg, other, acq.OperationID, RenewInput{OwnerToken: acq.OwnerToken, LeaseSeconds: 5})
		require.ErrorIs(t, err, ErrNotFound, "another tenant's operation does not exist")
		for _, n := range []int64{0, -1, int64(DefaultMaxTTL/time.Second) + 1} {
			_, err = b.adm.Renew(bg, b.p, acq.OperationID, RenewInput{OwnerToken: acq.OwnerToken, LeaseSeconds: n})
			require.True(t, isCode(err, CodeInvalidRequest), "lease_seconds %d: %v", n, err)
		}

		// Capped at the protection window, unless extend_ttl moves the window.
		r, err := b.adm.Renew(bg, b.p, acq.OperationID, RenewInput{OwnerToken: acq.OwnerToken, LeaseSeconds: 3600})
		require.NoError(t, err)
		require.Equal(t, acq.ExpiresAt, r.LeaseExpiresAt)
		require.Equal(t, acq.ExpiresAt, r.ExpiresAt)
		r, err = b.adm.Renew(bg, b.p, acq.OperationID, RenewInput{OwnerToken: acq.OwnerToken, LeaseSeconds: 3600, ExtendTTL: true})
		require.NoError(t, err)
		require.True(t, r.ExpiresAt.After(acq.ExpiresAt.Add(2900*time.Second)))
		require.Equal(t, r.LeaseExpiresAt, r.ExpiresAt)
		require.WithinDuration(t, r.ExpiresAt, *keyRow(t, b, "renew/refusals").ExpiresAt, time.Millisecond, "the hold moves too")
		m := opRow(t, b, acq.OperationID)
		require.WithinDuration(t, r.ExpiresAt, m.ExpiresAt, time.Millisecond)
		require.WithinDuration(t, r.LeaseExpiresAt, m.LeaseEnd(), time.Millisecond)

		// After an outcome: not in_progress any more.
		mustRecord(t, b, acq, OutcomeInput{Status: StateFailed})
		_, err = b.adm.Renew(bg, b.p, acq.OperationID, RenewInput{OwnerToken: acq.OwnerToken, LeaseSeconds: 5})
		require.ErrorIs(t, err, ErrInvalidTransition)
		// An owner-reported uncertain outcome with a live lease is not a lapsed lease.
		unsure := acquireLease(t, b, "renew/unsure", 600, 10, OnExpiryReadmit)
		mustRecord(t, b, unsure, OutcomeInput{Status: StateUncertain})
		_, err = b.adm.Renew(bg, b.p, unsure.OperationID, RenewInput{OwnerToken: unsure.OwnerToken, LeaseSeconds: 5})
		require.ErrorIs(t, err, ErrInvalidTransition)
		// A renew that finds its lease lapsed makes the operation uncertain and is refused.
		lapsed := acquireLease(t, b, "renew/lapsed", 600, 10, OnExpiryReadmit)
		lapseLease(t, b, lapsed.OperationID)
		_, err = b.adm.Renew(bg, b.p, lapsed.OperationID, RenewInput{OwnerToken: lapsed.OwnerToken, LeaseSeconds: 5})
		require.ErrorIs(t, err, ErrLeaseExpired)
		m = opRow(t, b, lapsed.OperationID)
		require.Equal(t, StateUncertain, m.State)
		require.Equal(t, ReasonLeaseExpired, deref(m.StateReason))
		require.True(t, m.LeaseEnd().Before(time.Now()), "the lease did not move")
	})
}

// TestRenewRacesReaperAndAcquire: 50 concurrent late renews of a lapsed lease, a reaper pass
// and acquires racing: no renew succeeds or moves the lease, and at most one acquire is
// admitted (none while the TTL protects the key; one once it is over).
// TestRenewBoundedByMaxTTL: a renew's lease_seconds is bounded by the configured maximum TTL,
// the bound of a fresh acquire's ttl_seconds, so extend_ttl never moves a key's protection
// window further from now than an acquire may set it. It was bounded by 30 days whatever
// IDEMGATE_MAX_TTL said: with a maximum of one hour, one renew held the key for 30 days; with a
// maximum of 60 days, a 40-day lease was refused.
func TestRenewBoundedByMaxTTL(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		hour := NewAdmission(b.db, slog.New(slog.DiscardHandler), time.Hour)
		acq, err := hour.Acquire(bg, b.p, AcquireInput{Key: "renew/max-ttl", TTLSeconds: 600})
		require.NoError(t, err)
		require.True(t, acq.Admitted)
		for _, extend := range []bool{true, false} {
			_, err = hour.Renew(bg, b.p, acq.OperationID, RenewInput{OwnerToken: acq.OwnerToken, LeaseSeconds: 3601, ExtendTTL: extend})
			require.Equal(t, []string{"lease_seconds"}, fieldsOf(t, err), "extend_ttl %v", extend)
		}
		require.WithinDuration(t, acq.ExpiresAt, opRow(t, b, acq.OperationID).ExpiresAt, time.Millisecond, "a refused renew moved the window")
		require.WithinDuration(t, acq.ExpiresAt, *keyRow(t, b, "renew/max-ttl").ExpiresAt, time.Millisecond, "a refused renew moved the hold")
		r, err := hour.Renew(bg, b.p, acq.OperationID, RenewInput{OwnerToken: acq.OwnerToken, LeaseSeconds: 3600, ExtendTTL: true})
		require.NoError(t, err)
		require.WithinDuration(t, time.Now().Add(time.Hour), r.ExpiresAt, time.Minute)

		long := NewAdmission(b.db, slog.New(slog.DiscardHandler), 60*24*time.Hour)
		acq, err = long.Acquire(bg, b.p, AcquireInput{Key: "renew/max-ttl-long", TTLSeconds: 50 * 86400})
		require.NoError(t, err)
		r, err = long.Renew(bg, b.p, acq.OperationID, RenewInput{OwnerToken: acq.OwnerToken, LeaseSeconds: 40 * 86400})
		require.NoError(t, err, "a lease within the configured maximum TTL")
		require.WithinDuration(t, time.Now().Add(40*24*time.Hour), r.LeaseExpiresAt, time.Minute)
		require.Equal(t, acq.ExpiresAt, r.ExpiresAt)
	})
}

func TestRenewRacesReaperAndAcquire(t *testing.T) {
	// Not parallel: its reaper passes would clear other tests' expired holds, which some
	// of them look at before clearing them themselves.
	eachDB(t, func(t *testing.T, b *testBundle) {
		for _, ttlOver := range []bool{false, true} {
			key := fmt.Sprintf("renew/race-%v", ttlOver)
			acq := acquireLease(t, b, key, 600, 30, OnExpiryReadmit)
			if ttlOver {
				endTTL(t, b, key, acq.OperationID)
			} else {
				lapseLease(t, b, acq.OperationID)
			}
			row := opRow(t, b, acq.OperationID)
			lease := row.LeaseEnd()
			var wg sync.WaitGroup
			var mu sync.Mutex
			admitted, renewed := 0, 0
			for i := 0; i < 50; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := b.adm.Renew(bg, b.p, acq.OperationID, RenewInput{OwnerToken: acq.OwnerToken, LeaseSeconds: 60})
					mu.Lock()
					defer mu.Unlock()
					if err == nil {
						renewed++
					} else if !errors.Is(err, ErrLeaseExpired) && !errors.Is(err, ErrStoreUnavailable) {
						t.Errorf("renew: %v", err)
					}
				}()
			}
			for i := 0; i < 5; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					a, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: key, TTLSeconds: 600})
					mu.Lock()
					defer mu.Unlock()
					if err == nil && a.Admitted {
						admitted++
					}
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := b.reaper.RunOnce(bg)
				if err != nil && !errors.Is(err, ErrStoreUnavailable) {
					t.Errorf("reaper: %v", err)
				}
			}()
			wg.Wait()
			require.Zero(t, renewed, "a renew after the lease lapsed never succeeds")
			m := opRow(t, b, acq.OperationID)
			require.True(t, m.LeaseEnd().Equal(lease), "the lease never moves: %v, was %v", m.LeaseEnd(), lease)
			require.Equal(t, StateUncertain, m.State)
			if ttlOver {
				require.Equal(t, 1, admitted, "once the TTL is over exactly one acquire takes the key over")
			} else {
				require.Zero(t, admitted, "the key stays protected until its TTL")
			}
		}
	})
}

// TestHoldUntilReconciled: with hold_until_reconciled a holder that just stops heartbeating
// leaves its key answering 409 outcome_uncertain past the TTL, through reaper passes, until an
// operator reconciles it: failed frees the key (fencing token +1), succeeded keeps answering
// duplicates with the outcome past the TTL.
func TestHoldUntilReconciled(t *testing.T) {
	// Not parallel: its reaper passes would clear other tests' expired holds, which some
	// of them look at before clearing them themselves.
	eachDB(t, func(t *testing.T, b *testBundle) {
		acct := operatorAcct(RoleOperator, &b.p.TenantID)
		for _, status := range []string{StateFailed, StateSucceeded} {
			key := "hold/" + status
			acq := acquireLease(t, b, key, 600, 30, OnExpiryHold)
			endTTL(t, b, key, acq.OperationID)
			for i := 0; i < 3; i++ {
				_, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: key, TTLSeconds: 600})
				op := requireOutcomeUncertain(t, err, acq.OperationID)
				require.Equal(t, ReasonLeaseExpired, deref(op.StateReason))
				_, err = b.reaper.RunOnce(bg)
				require.NoError(t, err)
			}
			_, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: key, TTLSeconds: 600})
			require.False(t, requireOutcomeUncertain(t, err, acq.OperationID).Held, "past its TTL the operation holds no live hold")
			items, err := b.adm.AcquireBatch(bg, b.p, []AcquireInput{{Key: key, TTLSeconds: 600}})
			require.NoError(t, err)
			requireOutcomeUncertain(t, items[0].Err, acq.OperationID)

			_, err = b.recon.ReconcileOutcome(bg, acct, acq.OperationID, ReconcileInput{Status: status, Note: "checked the ledger"})
			require.NoError(t, err)
			next, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: key, TTLSeconds: 600})
			require.NoError(t, err)
			if status == StateFailed {
				require.True(t, next.Admitted)
				require.Equal(t, acq.FencingToken+1, next.FencingToken)
				continue
			}
			require.False(t, next.Admitted, "succeeded answers duplicates past the TTL")
			require.Equal(t, acq.OperationID, next.Operation.ID)
			require.Equal(t, StateSucceeded, next.Operation.Outcome.Status)
		}

		// An owner-reported uncertain outcome under the hold policy answers 409 within the TTL.
		unsure := acquireLease(t, b, "hold/unsure", 600, 600, OnExpiryHold)
		mustRecord(t, b, unsure, OutcomeInput{Status: StateUncertain})
		_, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "hold/unsure", TTLSeconds: 600})
		requireOutcomeUncertain(t, err, unsure.OperationID)
	})
}

// Issue 28 item 2: the owner's own outcome is a first write after a lapsed lease like any
// other (docs/reference.md §8): the lapse is applied first, so an uncertain outcome keeps
// lease_expired_without_outcome (and duplicates get 409, as after any other first write), and a
// late succeeded leaves the lapse in the event log before the outcome.
func TestOutcomeAfterLapsedLeaseRecordsTheLapse(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		unc := acquireLease(t, b, "lease/own-uncertain", 600, 30, OnExpiryReadmit)
		late := acquireLease(t, b, "lease/late-success", 600, 30, OnExpiryReadmit)
		lapseLease(t, b, unc.OperationID)
		lapseLease(t, b, late.OperationID)

		op := mustRecord(t, b, unc, OutcomeInput{Status: StateUncertain, Note: ptr("timed out")})
		require.Equal(t, StateUncertain, op.State)
		require.Equal(t, ReasonLeaseExpired, deref(op.StateReason), "the lapse went unrecorded")
		_, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "lease/own-uncertain", TTLSeconds: 600})
		requireOutcomeUncertain(t, err, unc.OperationID)

		op = mustRecord(t, b, late, OutcomeInput{Status: StateSucceeded, Receipt: ptr("r-late")})
		require.Equal(t, StateSucceeded, op.State)
		var evs []models.Event
		require.NoError(t, b.db.Where("operation_id = ?", late.OperationID).Order("id").Find(&evs).Error)
		var kinds []string
		for _, e := range evs {
			kinds = append(kinds, e.Kind+" "+e.Actor+" "+e.Detail)
		}
		require.Equal(t, []string{
			EventStateChanged + " " + ActorSystem + " in_progress -> uncertain: " + ReasonLeaseExpired,
			EventOutcome + " api:" + b.p.Prefix + " uncertain -> succeeded: outcome succeeded, receipt r-late",
		}, kinds[len(kinds)-2:])
	})
}
