package services

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// recorder is an Observer that remembers every call as one line.
type recorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *recorder) add(parts ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, strings.Join(parts, " "))
}

func (r *recorder) AcquireDecided(_ context.Context, tenant, result string, _ Decision) {
	r.add("acquire", tenant, result)
}
func (r *recorder) ReleaseDecided(_ context.Context, source, result string, _ Decision) {
	r.add("release", source, result)
}
func (r *recorder) OutcomeDecided(_ context.Context, source, status, result string, _ Decision) {
	r.add("outcome", source, status, result)
}
func (r *recorder) ReaperPassed(_ context.Context, _ ReapResult, err error) {
	if err != nil {
		r.add("reap", "error")
		return
	}
	r.add("reap", "ok")
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.calls
	r.calls = nil
	return out
}

// TestObserverSeesDecisionsOnly: each decision is reported once, with bounded values whatever
// the caller sent; calls refused before a decision (invalid input, malformed ids, an auditor)
// are not; a copy made by WithObserver reports, the original does not.
func TestObserverSeesDecisionsOnly(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		rec := &recorder{}
		adm := b.adm.WithObserver(rec)
		p := b.p
		p.TenantName = "shop"
		in := AcquireInput{Key: "obs-1", TTLSeconds: 60, Fingerprint: ptr("a")}
		acq, err := adm.Acquire(bg, p, in)
		require.NoError(t, err)
		_, err = adm.Acquire(bg, p, in)
		require.NoError(t, err)
		_, err = adm.Acquire(bg, p, AcquireInput{Key: "obs-1", TTLSeconds: 60, Fingerprint: ptr("b")})
		require.ErrorIs(t, err, ErrFingerprintMismatch)
		_, err = adm.Acquire(bg, p, AcquireInput{Key: "", TTLSeconds: 60})
		require.ErrorIs(t, err, ErrInvalidRequest)
		_, err = b.adm.Acquire(bg, p, AcquireInput{Key: "obs-unobserved", TTLSeconds: 60})
		require.NoError(t, err, "the original Admission reports to nobody")
		require.Equal(t, []string{"acquire shop admitted", "acquire shop duplicate", "acquire shop conflict"}, rec.take())

		_, err = adm.Release(bg, p, ReleaseInput{Key: "obs-1"})
		require.ErrorIs(t, err, ErrInvalidRequest)
		_, err = adm.Release(bg, p, ReleaseInput{Key: "obs-1", OwnerToken: "ot_wrong"})
		require.ErrorIs(t, err, ErrNotOwner)
		_, err = adm.RecordOutcome(bg, p, "not-a-uuid", OutcomeInput{OwnerToken: acq.OwnerToken, Status: "failed"})
		require.ErrorIs(t, err, ErrNotFound)
		_, err = adm.RecordOutcome(bg, p, acq.OperationID, OutcomeInput{OwnerToken: "ot_wrong", Status: "made\nup"})
		require.ErrorIs(t, err, ErrNotOwner)
		_, err = adm.RecordOutcome(bg, p, acq.OperationID, OutcomeInput{OwnerToken: acq.OwnerToken, Status: "made up"})
		require.ErrorIs(t, err, ErrInvalidRequest)
		_, err = adm.RecordOutcome(bg, p, acq.OperationID, OutcomeInput{OwnerToken: acq.OwnerToken, Status: StateFailed})
		require.NoError(t, err)
		_, err = adm.RecordOutcome(bg, p, acq.OperationID, OutcomeInput{OwnerToken: acq.OwnerToken, Status: StateFailed})
		require.NoError(t, err)
		_, err = adm.Release(bg, p, ReleaseInput{Key: "obs-1", OwnerToken: acq.OwnerToken})
		require.NoError(t, err)
		require.Equal(t, []string{
			"release api not_owner",
			"outcome api invalid not_owner",
			"outcome api failed recorded",
			"outcome api failed unchanged",
			"release api released",
		}, rec.take())

		recon := b.recon.WithObserver(rec)
		auditor := &OperatorAccount{Username: "aud", Role: RoleAuditor}
		_, err = recon.OperatorRelease(bg, auditor, acq.OperationID, OperatorReleaseInput{OperationID: acq.OperationID,
			FencingToken: 1, Reason: "r"})
		require.ErrorIs(t, err, ErrUnauthorized)
		operator := &OperatorAccount{Username: "op", Role: RoleOperator}
		_, err = recon.OperatorRelease(bg, operator, acq.OperationID, OperatorReleaseInput{OperationID: acq.OperationID,
			FencingToken: 1, Reason: "r"})
		require.ErrorIs(t, err, ErrKeyNotHeld)
		_, err = recon.ReconcileOutcome(bg, operator, acq.OperationID, ReconcileInput{Status: StateSucceeded, Note: "n"})
		require.ErrorIs(t, err, ErrInvalidTransition)
		require.Equal(t, []string{"release operator key_not_held", "outcome operator succeeded invalid_transition"}, rec.take())

		reaper := b.reaper.WithObserver(rec)
		_, err = reaper.RunOnce(bg)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(bg)
		cancel()
		_, err = reaper.RunOnce(ctx)
		require.Error(t, err)
		require.Equal(t, []string{"reap ok"}, rec.take(), "a pass cut short by shutdown is not reported")
	})
}
