package services

import (
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
)

func TestReleaseByOwner(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acq := mustAcquire(t, b, "rel/ok", 60)
		_, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "rel/ok", TTLSeconds: 60}) // a duplicate
		require.NoError(t, err)

		op, err := b.adm.Release(bg, b.p, ReleaseInput{Key: "rel/ok", OwnerToken: acq.OwnerToken, Reason: ptr("job cancelled")})
		require.NoError(t, err)
		require.Equal(t, acq.OperationID, op.ID)
		require.Equal(t, StateReleased, op.State)
		require.False(t, op.Held)
		require.NotNil(t, op.ReleasedAt)
		require.Equal(t, "job cancelled", deref(op.ReleaseReason))
		require.Nil(t, op.Outcome)
		require.EqualValues(t, 1, op.DuplicateAttempts)
		require.EqualValues(t, 1, op.FencingToken)

		k, err := b.reads.GetKey(bg, b.p.TenantID, "rel/ok")
		require.NoError(t, err)
		require.False(t, k.Held)
		require.Nil(t, k.ExpiresAt)
		require.Equal(t, acq.OperationID, k.Operation.ID)
		require.Equal(t, StateReleased, k.Operation.State)
		row := keyRow(t, b, "rel/ok")
		require.Nil(t, row.HolderOperationID)
		require.Nil(t, row.ExpiresAt)

		d, err := b.reads.GetOperation(bg, b.p.TenantID, acq.OperationID)
		require.NoError(t, err)
		require.Len(t, d.Events, 1)
		require.Equal(t, EventReleased, d.Events[0].Kind)
		require.Equal(t, "api:"+b.p.Prefix, d.Events[0].Actor)
		require.Equal(t, "in_progress -> released: job cancelled", d.Events[0].Detail)

		// Releasing again: the key is free now.
		before := snapshot(t, b, acq.OperationID)
		_, err = release(b, acq)
		require.ErrorIs(t, err, ErrKeyNotHeld)
		require.Equal(t, before, snapshot(t, b, acq.OperationID))
	})
}

func TestReleaseRefusalsChangeNothing(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		// Wrong token.
		acq := mustAcquire(t, b, "rel-wrong", 60)
		other := mustAcquire(t, b, "rel-other", 60)
		before := snapshot(t, b, acq.OperationID)
		for _, tok := range []string{"ot_wrong", other.OwnerToken, acq.OwnerToken + "x"} {
			_, err := b.adm.Release(bg, b.p, ReleaseInput{Key: "rel-wrong", OwnerToken: tok})
			require.ErrorIs(t, err, ErrNotOwner)
		}
		require.Equal(t, before, snapshot(t, b, acq.OperationID))

		// A wrong token is not_owner even when the state would also refuse.
		succ := intoState(t, b, "rel-succ-wrong", "succeeded")
		before = snapshot(t, b, succ.OperationID)
		_, err := b.adm.Release(bg, b.p, ReleaseInput{Key: "rel-succ-wrong", OwnerToken: other.OwnerToken})
		require.ErrorIs(t, err, ErrNotOwner)
		_, err = release(b, succ)
		require.ErrorIs(t, err, ErrEffectConfirmed)
		require.Equal(t, before, snapshot(t, b, succ.OperationID))

		// Uncertain (recorded by the caller): reconcile first.
		unc := intoState(t, b, "rel-unc", "uncertain")
		before = snapshot(t, b, unc.OperationID)
		_, err = release(b, unc)
		require.ErrorIs(t, err, ErrOutcomeUncertain)
		require.Equal(t, before, snapshot(t, b, unc.OperationID))

		// Never acquired in this tenant.
		c := countRows(t, b)
		_, err = b.adm.Release(bg, b.p, ReleaseInput{Key: "never-acquired", OwnerToken: acq.OwnerToken})
		require.ErrorIs(t, err, ErrKeyNotHeld)
		require.Equal(t, c, countRows(t, b))

		// Malformed input is invalid_request and writes nothing.
		for _, in := range []ReleaseInput{
			{Key: "", OwnerToken: acq.OwnerToken},
			{Key: "rel-wrong", OwnerToken: ""},
			{Key: "rel-wrong", OwnerToken: acq.OwnerToken, Reason: ptr(strings.Repeat("r", MaxReasonChars+1))},
			{Key: "bad\x00key", OwnerToken: acq.OwnerToken},
		} {
			_, err := b.adm.Release(bg, b.p, in)
			require.ErrorIs(t, err, ErrInvalidRequest)
		}
		require.Equal(t, c, countRows(t, b))
		require.Equal(t, StateInProgress, opRow(t, b, acq.OperationID).State)
	})
}

// docs/reference.md §1.3: a late release after expiry, or after another attempt acquired the key, changes
// nothing. Not parallel: it checks that an expired operation stays in_progress until something
// marks it, and the parallel tests' reaper passes (RunOnce covers every tenant) would mark it
// uncertain in between (seen once in CI: "expected in_progress, actual uncertain").
func TestLateRelease(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		expired := mustAcquire(t, b, "late-expired", 1)
		a := mustAcquire(t, b, "late-reacquired", 1)
		b.elapse(t, time.Second)

		// Expired, nobody took it over yet: key_not_held, and the operation stays in_progress
		// (marking it uncertain is left to the next acquire or the reaper).
		before := snapshot(t, b, expired.OperationID)
		_, err := release(b, expired)
		require.ErrorIs(t, err, ErrKeyNotHeld)
		require.Equal(t, before, snapshot(t, b, expired.OperationID))
		require.Equal(t, StateInProgress, before.Op.State)
		k, err := b.reads.GetKey(bg, b.p.TenantID, "late-expired")
		require.NoError(t, err)
		require.False(t, k.Held)
		require.Nil(t, k.ExpiresAt)
		require.False(t, k.Operation.Held)

		// B took the key over; A's late release must not touch B's hold.
		bAcq := mustAcquire(t, b, "late-reacquired", 60)
		require.EqualValues(t, 2, bAcq.FencingToken)
		beforeA, beforeB := snapshot(t, b, a.OperationID), snapshot(t, b, bAcq.OperationID)
		_, err = release(b, a)
		require.ErrorIs(t, err, ErrNotOwner)
		require.Equal(t, beforeA, snapshot(t, b, a.OperationID))
		require.Equal(t, beforeB, snapshot(t, b, bAcq.OperationID))
		k, err = b.reads.GetKey(bg, b.p.TenantID, "late-reacquired")
		require.NoError(t, err)
		require.True(t, k.Held)
		require.Equal(t, bAcq.OperationID, k.Operation.ID)
		require.Equal(t, StateInProgress, k.Operation.State)
		require.Equal(t, StateUncertain, beforeA.Op.State)

		// B can still release its own hold.
		op, err := release(b, bAcq)
		require.NoError(t, err)
		require.Equal(t, StateReleased, op.State)
		require.Equal(t, StateUncertain, opRow(t, b, a.OperationID).State)
	})
}

// docs/reference.md §1.6: a tenant can never see, admit against, or release another tenant's keys.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		q := otherTenant(t, b)
		mine := mustAcquire(t, b, "shared-key", 60)
		theirs, err := b.adm.Acquire(bg, q, AcquireInput{Key: "shared-key", TTLSeconds: 60, Fingerprint: ptr("other")})
		require.NoError(t, err)
		require.True(t, theirs.Admitted, "the same key in another tenant is a different key")
		require.EqualValues(t, 1, theirs.FencingToken)
		require.EqualValues(t, 1, mine.FencingToken)
		require.NotEqual(t, mine.OperationID, theirs.OperationID)
		onlyMine := mustAcquire(t, b, "only-mine", 60)

		beforeMine, beforeTheirs := snapshot(t, b, mine.OperationID), snapshot(t, b, theirs.OperationID)

		// Reads.
		_, err = b.reads.GetKey(bg, q.TenantID, "only-mine")
		require.ErrorIs(t, err, ErrNotFound)
		k, err := b.reads.GetKey(bg, q.TenantID, "shared-key")
		require.NoError(t, err)
		require.Equal(t, theirs.OperationID, k.Operation.ID)
		_, err = b.reads.GetOperation(bg, q.TenantID, mine.OperationID)
		require.ErrorIs(t, err, ErrNotFound)
		_, err = b.reads.GetOperation(bg, b.p.TenantID, theirs.OperationID)
		require.ErrorIs(t, err, ErrNotFound)

		page, err := b.reads.ListKeys(bg, q.TenantID, KeyFilter{})
		require.NoError(t, err)
		require.Len(t, page.Items, 1)
		require.Equal(t, theirs.OperationID, page.Items[0].Operation.ID)
		page, err = b.reads.ListKeys(bg, b.p.TenantID, KeyFilter{})
		require.NoError(t, err)
		require.Len(t, page.Items, 2)
		for _, it := range page.Items {
			require.NotEqual(t, theirs.OperationID, it.Operation.ID)
		}

		atts, err := b.reads.ListAttempts(bg, q.TenantID, AttemptFilter{})
		require.NoError(t, err)
		require.Len(t, atts.Items, 1)
		require.Equal(t, theirs.OperationID, deref(atts.Items[0].OperationID))
		atts, err = b.reads.ListAttempts(bg, q.TenantID, AttemptFilter{Key: "only-mine"})
		require.NoError(t, err)
		require.Empty(t, atts.Items)

		// Writes with the other tenant's principal, even with the right owner token.
		_, err = b.adm.Release(bg, q, ReleaseInput{Key: "only-mine", OwnerToken: onlyMine.OwnerToken})
		require.ErrorIs(t, err, ErrKeyNotHeld)
		_, err = b.adm.Release(bg, q, ReleaseInput{Key: "shared-key", OwnerToken: mine.OwnerToken})
		require.ErrorIs(t, err, ErrNotOwner)
		_, err = b.adm.RecordOutcome(bg, q, mine.OperationID, OutcomeInput{OwnerToken: mine.OwnerToken, Status: StateSucceeded})
		require.ErrorIs(t, err, ErrNotFound)
		_, err = b.adm.RecordOutcome(bg, b.p, theirs.OperationID, OutcomeInput{OwnerToken: theirs.OwnerToken, Status: StateFailed})
		require.ErrorIs(t, err, ErrNotFound)
		// A duplicate acquire in the other tenant does not count against mine.
		_, err = b.adm.Acquire(bg, q, AcquireInput{Key: "shared-key", TTLSeconds: 60, Fingerprint: ptr("other")})
		require.NoError(t, err)

		require.Equal(t, beforeMine, snapshot(t, b, mine.OperationID))
		require.Equal(t, StateInProgress, opRow(t, b, onlyMine.OperationID).State)
		afterTheirs := snapshot(t, b, theirs.OperationID)
		require.Equal(t, beforeTheirs.Attempts+1, afterTheirs.Attempts)
		require.Equal(t, beforeTheirs.Op.DuplicateAttempts+1, afterTheirs.Op.DuplicateAttempts)
		afterTheirs.Op.DuplicateAttempts = beforeTheirs.Op.DuplicateAttempts
		require.Equal(t, beforeTheirs.Op, afterTheirs.Op)

		// Each owner acts on its own tenant's key.
		op, err := b.adm.Release(bg, q, ReleaseInput{Key: "shared-key", OwnerToken: theirs.OwnerToken})
		require.NoError(t, err)
		require.Equal(t, theirs.OperationID, op.ID)
		k, err = b.reads.GetKey(bg, b.p.TenantID, "shared-key")
		require.NoError(t, err)
		require.True(t, k.Held)
		require.Equal(t, mine.OperationID, k.Operation.ID)
	})
}

// TestReleaseAfterLeaseLapsed: a release (the owner's and the operator's) of an in_progress
// operation whose lease lapsed within its TTL does not depend on whether the reaper ran: it
// makes the operation uncertain (lease_expired_without_outcome, with its event) in its own
// transaction and is refused outcome_uncertain, the key staying protected; the owner's late
// outcome still lands afterwards (docs/reference.md §8).
func TestReleaseAfterLeaseLapsed(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acq := acquireLease(t, b, "release/lapsed", 60, 30, OnExpiryReadmit)
		lapseLease(t, b, acq.OperationID)
		_, err := b.adm.Release(bg, b.p, ReleaseInput{Key: "release/lapsed", OwnerToken: "wrong"})
		require.ErrorIs(t, err, ErrNotOwner)
		require.Equal(t, StateInProgress, opRow(t, b, acq.OperationID).State, "a wrong token changes nothing")

		_, err = b.adm.Release(bg, b.p, ReleaseInput{Key: "release/lapsed", OwnerToken: acq.OwnerToken})
		require.ErrorIs(t, err, ErrOutcomeUncertain)
		m := opRow(t, b, acq.OperationID)
		require.Equal(t, StateUncertain, m.State)
		require.Equal(t, ReasonLeaseExpired, deref(m.StateReason))
		var evs []models.Event
		require.NoError(t, b.db.Where("operation_id = ?", acq.OperationID).Order("id").Find(&evs).Error)
		require.Equal(t, "in_progress -> uncertain: "+ReasonLeaseExpired, evs[len(evs)-1].Detail)
		require.Equal(t, acq.OperationID, deref(keyRow(t, b, "release/lapsed").HolderOperationID), "the key stays protected")
		_, err = b.adm.Acquire(bg, b.p, AcquireInput{Key: "release/lapsed", TTLSeconds: 60})
		requireOutcomeUncertain(t, err, acq.OperationID)

		// Asked again (now as the reaper would have left it): the same answer.
		_, err = b.adm.Release(bg, b.p, ReleaseInput{Key: "release/lapsed", OwnerToken: acq.OwnerToken})
		require.ErrorIs(t, err, ErrOutcomeUncertain)

		// The owner's late outcome still lands: uncertain -> succeeded.
		op, err := b.adm.RecordOutcome(bg, b.p, acq.OperationID, OutcomeInput{OwnerToken: acq.OwnerToken, Status: StateSucceeded})
		require.NoError(t, err)
		require.Equal(t, StateSucceeded, op.State)

		// The operator's release, with the fencing token the operator saw.
		acct := operatorAcct(RoleOperator, nil)
		other := acquireLease(t, b, "release/lapsed-op", 60, 30, OnExpiryReadmit)
		lapseLease(t, b, other.OperationID)
		_, err = b.recon.OperatorRelease(bg, acct, other.OperationID,
			OperatorReleaseInput{OperationID: other.OperationID, FencingToken: other.FencingToken, Reason: "cleanup"})
		require.ErrorIs(t, err, ErrOutcomeUncertain)
		m = opRow(t, b, other.OperationID)
		require.Equal(t, StateUncertain, m.State)
		require.Equal(t, ReasonLeaseExpired, deref(m.StateReason))
		require.Equal(t, other.OperationID, deref(keyRow(t, b, "release/lapsed-op").HolderOperationID))
		op, err = b.adm.RecordOutcome(bg, b.p, other.OperationID, OutcomeInput{OwnerToken: other.OwnerToken, Status: StateFailed})
		require.NoError(t, err)
		require.Equal(t, StateFailed, op.State)
	})
}
