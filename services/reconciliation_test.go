package services

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// operatorAcct returns a dashboard account of role; tenant nil makes it global.
func operatorAcct(role string, tenant *int64) *OperatorAccount {
	return &OperatorAccount{ID: 1, Username: "oncall-" + role, Role: role, TenantID: tenant}
}

// makeUncertain acquires key with a 1 s TTL and lets it expire into uncertain via the reaper.
func makeUncertain(t *testing.T, b *testBundle, key string) *Acquisition {
	t.Helper()
	acq := mustAcquire(t, b, key, 1)
	b.elapse(t, time.Second)
	_, err := b.reaper.RunOnce(bg)
	require.NoError(t, err)
	require.Equal(t, StateUncertain, opRow(t, b, acq.OperationID).State)
	return acq
}

func TestReconcileOutcomeTransitions(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acct := operatorAcct(RoleOperator, &b.p.TenantID)

		// uncertain -> succeeded, recorded as the operator with a receipt and an event.
		unc := makeUncertain(t, b, "rec/uncertain")
		op, err := b.recon.ReconcileOutcome(bg, acct, unc.OperationID, ReconcileInput{
			Status: StateSucceeded, Receipt: ptr("ch_123"), Note: "checked the PSP dashboard"})
		require.NoError(t, err)
		require.Equal(t, StateSucceeded, op.State)
		require.NotNil(t, op.Outcome)
		require.Equal(t, acct.Username, op.Outcome.RecordedBy)
		require.Equal(t, "ch_123", deref(op.Outcome.Receipt))
		require.Equal(t, "checked the PSP dashboard", deref(op.Outcome.Note))
		d, err := b.reads.GetOperation(bg, b.p.TenantID, unc.OperationID)
		require.NoError(t, err)
		last := d.Events[len(d.Events)-1]
		require.Equal(t, EventOutcome, last.Kind)
		require.Equal(t, acct.Username, last.Actor)
		require.Contains(t, last.Detail, "uncertain -> succeeded")

		// in_progress -> failed; the hold stays (release is its own, owner-checked step).
		run := mustAcquire(t, b, "rec/running", 60)
		op, err = b.recon.ReconcileOutcome(bg, acct, run.OperationID, ReconcileInput{Status: StateFailed, Note: "declined"})
		require.NoError(t, err)
		require.Equal(t, StateFailed, op.State)
		require.True(t, op.Held)

		// Any other state is refused and nothing changes: failed, succeeded (also a repeat),
		// released.
		for _, id := range []string{run.OperationID, unc.OperationID} {
			before := snapshot(t, b, id)
			_, err = b.recon.ReconcileOutcome(bg, acct, id, ReconcileInput{Status: StateSucceeded, Note: "again"})
			require.ErrorIs(t, err, ErrInvalidTransition)
			require.Equal(t, before, snapshot(t, b, id))
		}
		rel := mustAcquire(t, b, "rec/released", 60)
		_, err = release(b, rel)
		require.NoError(t, err)
		_, err = b.recon.ReconcileOutcome(bg, acct, rel.OperationID, ReconcileInput{Status: StateFailed, Note: "x"})
		require.ErrorIs(t, err, ErrInvalidTransition)
	})
}

func TestReconcileOutcomeKeepsStoredResponse(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acq := mustAcquire(t, b, "rec/resp", 60)
		mustRecord(t, b, acq, OutcomeInput{Status: StateUncertain, Response: []byte(`{"psp":"timeout"}`)})
		op, err := b.recon.ReconcileOutcome(bg, operatorAcct(RoleAdmin, nil), acq.OperationID,
			ReconcileInput{Status: StateSucceeded, Note: "found it"})
		require.NoError(t, err)
		require.Equal(t, StateSucceeded, op.State)
		require.JSONEq(t, `{"psp":"timeout"}`, string(op.Outcome.Response))
		require.Equal(t, "oncall-admin", op.Outcome.RecordedBy)
	})
}

func TestOperatorActionsValidation(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acct := operatorAcct(RoleOperator, nil)
		acq := mustAcquire(t, b, "val/op", 60)
		other := mustAcquire(t, b, "val/other", 60)
		before := snapshot(t, b, acq.OperationID)
		fieldsOf := func(err error) []string {
			var de *Error
			require.True(t, errors.As(err, &de), "%v", err)
			require.Equal(t, CodeInvalidRequest, de.Code)
			var out []string
			for _, f := range de.Fields {
				out = append(out, f.Field)
			}
			return out
		}
		for _, in := range []ReconcileInput{
			{Status: StateSucceeded},
			{Status: StateSucceeded, Note: "  \n "},
			{Status: StateSucceeded, Note: strings.Repeat("n", MaxNoteChars+1)},
		} {
			_, err := b.recon.ReconcileOutcome(bg, acct, acq.OperationID, in)
			require.Equal(t, []string{"note"}, fieldsOf(err))
		}
		_, err := b.recon.ReconcileOutcome(bg, acct, acq.OperationID, ReconcileInput{Status: "uncertain", Note: "n",
			Receipt: ptr(strings.Repeat("r", MaxReceiptChars+1))})
		require.Equal(t, []string{"status", "receipt"}, fieldsOf(err))

		for _, in := range []OperatorReleaseInput{
			{OperationID: acq.OperationID, FencingToken: 1},
			{OperationID: acq.OperationID, FencingToken: 1, Reason: " "},
			{OperationID: acq.OperationID, FencingToken: 1, Reason: strings.Repeat("r", MaxReasonChars+1)},
		} {
			_, err := b.recon.OperatorRelease(bg, acct, acq.OperationID, in)
			require.Equal(t, []string{"reason"}, fieldsOf(err))
		}
		_, err = b.recon.OperatorRelease(bg, acct, acq.OperationID,
			OperatorReleaseInput{OperationID: other.OperationID, FencingToken: 0, Reason: "r"})
		require.Equal(t, []string{"operation_id", "fencing_token"}, fieldsOf(err))
		require.Equal(t, before, snapshot(t, b, acq.OperationID))
		require.Equal(t, StateInProgress, opRow(t, b, other.OperationID).State)
	})
}

func TestOperatorActionsRefuseAuditors(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acq := mustAcquire(t, b, "aud/op", 60)
		before := snapshot(t, b, acq.OperationID)
		for _, acct := range []*OperatorAccount{operatorAcct(RoleAuditor, nil), {Username: "x", Role: "bogus"}, nil} {
			_, err := b.recon.ReconcileOutcome(bg, acct, acq.OperationID, ReconcileInput{Status: StateFailed, Note: "n"})
			require.ErrorIs(t, err, ErrUnauthorized)
			_, err = b.recon.OperatorRelease(bg, acct, acq.OperationID,
				OperatorReleaseInput{OperationID: acq.OperationID, FencingToken: 1, Reason: "r"})
			require.ErrorIs(t, err, ErrUnauthorized)
		}
		require.Equal(t, before, snapshot(t, b, acq.OperationID))
		// Reading is allowed.
		d, err := b.dash.OperationForOperator(bg, operatorAcct(RoleAuditor, nil), acq.OperationID)
		require.NoError(t, err)
		require.Equal(t, acq.OperationID, d.ID)
	})
}

func TestOperatorTenantScope(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acq := mustAcquire(t, b, "scope/op", 60)
		other := otherTenant(t, b)
		restricted := operatorAcct(RoleOperator, &other.TenantID)
		before := snapshot(t, b, acq.OperationID)

		_, err := b.dash.OperationForOperator(bg, restricted, acq.OperationID)
		require.ErrorIs(t, err, ErrNotFound)
		_, err = b.recon.ReconcileOutcome(bg, restricted, acq.OperationID, ReconcileInput{Status: StateFailed, Note: "n"})
		require.ErrorIs(t, err, ErrNotFound)
		_, err = b.recon.OperatorRelease(bg, restricted, acq.OperationID,
			OperatorReleaseInput{OperationID: acq.OperationID, FencingToken: 1, Reason: "r"})
		require.ErrorIs(t, err, ErrNotFound)
		require.Equal(t, before, snapshot(t, b, acq.OperationID))
		for _, id := range []string{"not-a-uuid", "00000000-0000-4000-8000-000000000000"} {
			_, err = b.dash.OperationForOperator(bg, restricted, id)
			require.ErrorIs(t, err, ErrNotFound)
		}

		// The own tenant's account and a global one see it.
		for _, acct := range []*OperatorAccount{operatorAcct(RoleAuditor, &b.p.TenantID), operatorAcct(RoleAuditor, nil)} {
			d, err := b.dash.OperationForOperator(bg, acct, strings.ToUpper(acq.OperationID))
			require.NoError(t, err)
			require.Equal(t, acq.OperationID, d.ID)
			require.Equal(t, b.p.TenantID, d.TenantID)
			require.NotEmpty(t, d.TenantName)
		}
	})
}

func TestOperationForOperatorHolderAndGenerations(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acct := operatorAcct(RoleAuditor, nil)
		first, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "gen/k", TTLSeconds: 1, AttemptID: ptr("try-1")})
		require.NoError(t, err)
		d, err := b.dash.OperationForOperator(bg, acct, first.OperationID)
		require.NoError(t, err)
		require.True(t, d.HoldsKey)
		require.True(t, d.Held)
		require.Equal(t, first.OperationID, d.Holder.OperationID)
		require.Equal(t, "try-1", deref(d.Holder.AttemptID))
		require.Len(t, d.Attempts, 1)
		b.elapse(t, time.Second)
		second, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "gen/k", TTLSeconds: 60, AttemptID: ptr("try-2")})
		require.NoError(t, err)
		require.True(t, second.Admitted)

		d, err = b.dash.OperationForOperator(bg, acct, first.OperationID)
		require.NoError(t, err)
		require.False(t, d.HoldsKey)
		require.False(t, d.Held)
		require.Equal(t, StateUncertain, d.State)
		require.Equal(t, HolderInfo{OperationID: second.OperationID, FencingToken: 2, AttemptID: ptr("try-2"),
			AcquiredAt: d.Holder.AcquiredAt, ExpiresAt: second.ExpiresAt}, *d.Holder)
		require.Len(t, d.Generations, 2)
		require.Equal(t, first.OperationID, d.Generations[0].ID)
		require.EqualValues(t, 1, d.Generations[0].FencingToken)
		require.Equal(t, StateUncertain, d.Generations[0].State)
		require.Equal(t, second.OperationID, d.Generations[1].ID)
		require.Equal(t, StateInProgress, d.Generations[1].State)
		require.False(t, d.Now.IsZero())

		// A released key has no holder.
		_, err = b.adm.Release(bg, b.p, ReleaseInput{Key: "gen/k", OwnerToken: second.OwnerToken})
		require.NoError(t, err)
		d, err = b.dash.OperationForOperator(bg, acct, second.OperationID)
		require.NoError(t, err)
		require.Nil(t, d.Holder)
		require.False(t, d.HoldsKey)
	})
}

func TestOperatorRelease(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acct := operatorAcct(RoleOperator, &b.p.TenantID)

		// in_progress, held: released by compare on the operation, event names the operator.
		acq := mustAcquire(t, b, "orel/ok", 60)
		op, err := b.recon.OperatorRelease(bg, acct, acq.OperationID,
			OperatorReleaseInput{OperationID: acq.OperationID, FencingToken: 1, Reason: "worker crashed"})
		require.NoError(t, err)
		require.Equal(t, StateReleased, op.State)
		require.Equal(t, "worker crashed", deref(op.ReleaseReason))
		require.Nil(t, keyRow(t, b, "orel/ok").HolderOperationID)
		d, err := b.reads.GetOperation(bg, b.p.TenantID, acq.OperationID)
		require.NoError(t, err)
		require.Equal(t, acct.Username, d.Events[len(d.Events)-1].Actor)
		require.Equal(t, "in_progress -> released: worker crashed", d.Events[len(d.Events)-1].Detail)

		// Again: nobody holds it, nothing changes.
		before := snapshot(t, b, acq.OperationID)
		_, err = b.recon.OperatorRelease(bg, acct, acq.OperationID,
			OperatorReleaseInput{OperationID: acq.OperationID, FencingToken: 1, Reason: "again"})
		require.ErrorIs(t, err, ErrKeyNotHeld)
		require.Equal(t, before, snapshot(t, b, acq.OperationID))

		// failed and still held: releasable.
		failed := mustAcquire(t, b, "orel/failed", 60)
		mustRecord(t, b, failed, OutcomeInput{Status: StateFailed})
		op, err = b.recon.OperatorRelease(bg, acct, failed.OperationID,
			OperatorReleaseInput{OperationID: failed.OperationID, FencingToken: 1, Reason: "declined, free the key"})
		require.NoError(t, err)
		require.Equal(t, StateReleased, op.State)
		require.Equal(t, StateFailed, op.Outcome.Status, "the failed outcome is kept")

		// succeeded and held: refused.
		done := mustAcquire(t, b, "orel/done", 60)
		mustRecord(t, b, done, OutcomeInput{Status: StateSucceeded})
		before = snapshot(t, b, done.OperationID)
		_, err = b.recon.OperatorRelease(bg, acct, done.OperationID,
			OperatorReleaseInput{OperationID: done.OperationID, FencingToken: 1, Reason: "r"})
		require.ErrorIs(t, err, ErrEffectConfirmed)
		require.Equal(t, before, snapshot(t, b, done.OperationID))

		// uncertain and still the holder: reconcile first.
		unc := mustAcquire(t, b, "orel/unc", 60)
		mustRecord(t, b, unc, OutcomeInput{Status: StateUncertain})
		before = snapshot(t, b, unc.OperationID)
		_, err = b.recon.OperatorRelease(bg, acct, unc.OperationID,
			OperatorReleaseInput{OperationID: unc.OperationID, FencingToken: 1, Reason: "r"})
		require.ErrorIs(t, err, ErrOutcomeUncertain)
		require.Equal(t, before, snapshot(t, b, unc.OperationID))

		// Fencing token other than the hold's: refused, nothing changes.
		held := mustAcquire(t, b, "orel/fence", 60)
		before = snapshot(t, b, held.OperationID)
		_, err = b.recon.OperatorRelease(bg, acct, held.OperationID,
			OperatorReleaseInput{OperationID: held.OperationID, FencingToken: 2, Reason: "r"})
		require.ErrorIs(t, err, ErrNotOwner)
		require.Equal(t, before, snapshot(t, b, held.OperationID))
	})
}

// TestOperatorReleaseExpiredHold: an expired hold nobody has cleared yet is still this
// operation's, and the operator may clean it up.
func TestOperatorReleaseExpiredHold(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acq := mustAcquire(t, b, "orel/expired", 1)
		b.elapse(t, time.Second)
		d, err := b.dash.OperationForOperator(bg, operatorAcct(RoleAuditor, nil), acq.OperationID)
		require.NoError(t, err)
		require.True(t, d.HoldsKey)
		require.False(t, d.Held)
		op, err := b.recon.OperatorRelease(bg, operatorAcct(RoleOperator, nil), acq.OperationID,
			OperatorReleaseInput{OperationID: acq.OperationID, FencingToken: 1, Reason: "crashed, cleaning up"})
		require.NoError(t, err)
		require.Equal(t, StateReleased, op.State)
		require.Nil(t, keyRow(t, b, "orel/expired").HolderOperationID)
	})
}

// TestOperatorReleaseStaleRace is docs/reference.md §5's race: the operator saw operation A with fencing
// token 1; A's hold expires and attempt B acquires the key; the operator's release of A must
// name B and leave B's hold intact.
func TestOperatorReleaseStaleRace(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acct := operatorAcct(RoleOperator, nil)
		a := mustAcquire(t, b, "race/k", 1)
		seen, err := b.dash.OperationForOperator(bg, acct, a.OperationID)
		require.NoError(t, err)
		require.True(t, seen.HoldsKey)
		b.elapse(t, time.Second)
		bAcq, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "race/k", TTLSeconds: 60, AttemptID: ptr("attempt-b")})
		require.NoError(t, err)
		require.True(t, bAcq.Admitted)
		beforeA, beforeB := snapshot(t, b, a.OperationID), snapshot(t, b, bAcq.OperationID)

		_, err = b.recon.OperatorRelease(bg, acct, a.OperationID,
			OperatorReleaseInput{OperationID: a.OperationID, FencingToken: seen.FencingToken, Reason: "stuck"})
		require.ErrorIs(t, err, ErrNotOwner)
		var held *HeldByAnotherError
		require.True(t, errors.As(err, &held))
		require.Equal(t, bAcq.OperationID, held.Holder.OperationID)
		require.EqualValues(t, 2, held.Holder.FencingToken)
		require.Equal(t, "attempt-b", deref(held.Holder.AttemptID))
		require.True(t, isCode(err, CodeNotOwner))
		require.Contains(t, err.Error(), bAcq.OperationID)

		require.Equal(t, beforeA, snapshot(t, b, a.OperationID))
		require.Equal(t, beforeB, snapshot(t, b, bAcq.OperationID))
		k, err := b.reads.GetKey(bg, b.p.TenantID, "race/k")
		require.NoError(t, err)
		require.True(t, k.Held)
		require.Equal(t, bAcq.OperationID, k.Operation.ID)

		// B releases the key: now nobody holds it.
		_, err = b.adm.Release(bg, b.p, ReleaseInput{Key: "race/k", OwnerToken: bAcq.OwnerToken})
		require.NoError(t, err)
		_, err = b.recon.OperatorRelease(bg, acct, a.OperationID,
			OperatorReleaseInput{OperationID: a.OperationID, FencingToken: 1, Reason: "stuck"})
		require.ErrorIs(t, err, ErrKeyNotHeld)
	})
}

// docs/reference.md §3: recording the same outcome again succeeds and changes nothing, also from the
// dashboard (a form submitted twice); a different one is refused.
func TestReconcileOutcomeRepeatIsNoOp(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acct := operatorAcct(RoleOperator, &b.p.TenantID)
		acq := mustAcquire(t, b, "reconcile-twice", 60)
		in := ReconcileInput{Status: StateSucceeded, Receipt: ptr("rcpt-9"), Note: "checked the PSP dashboard"}
		_, err := b.recon.ReconcileOutcome(bg, acct, acq.OperationID, in)
		require.NoError(t, err)
		before := snapshot(t, b, acq.OperationID)
		op, err := b.recon.ReconcileOutcome(bg, acct, acq.OperationID, in)
		require.NoError(t, err)
		require.Equal(t, StateSucceeded, op.State)
		require.Equal(t, before, snapshot(t, b, acq.OperationID), "the repeat changed nothing")
		in.Receipt = ptr("rcpt-other")
		_, err = b.recon.ReconcileOutcome(bg, acct, acq.OperationID, in)
		require.ErrorIs(t, err, ErrInvalidTransition)
	})
}
