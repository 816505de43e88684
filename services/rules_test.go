package services

import (
	"fmt"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
)

// TestAdmissionRulesAgree holds both stores to the rules of rules.go. PostgreSQL decides in
// PL/pgSQL, SQLite in Go by the rules themselves; each case sets a key up, asks the rules what
// the acquire must answer (from the rows as stored) and asks the store, on both dialects. The
// table's want column checks the rules themselves.
func TestAdmissionRulesAgree(t *testing.T) {
	type query struct {
		in       AcquireInput
		otherKey bool // sent by another API key of the tenant
	}
	live := []struct {
		name    string
		outcome string // recorded on the holder before the query ("" for none)
		q       query
		want    string // the rule's answer: admitted (a re-admission), duplicate or conflict
	}{
		{"same request", "", query{in: AcquireInput{Fingerprint: ptr("fp"), Operation: ptr("charge")}}, ResultDuplicate},
		{"other fingerprint", "", query{in: AcquireInput{Fingerprint: ptr("other"), Operation: ptr("charge")}}, ResultConflict},
		{"no fingerprint", "", query{in: AcquireInput{Operation: ptr("charge")}}, ResultConflict},
		{"other operation name", "", query{in: AcquireInput{Fingerprint: ptr("fp"), Operation: ptr("refund")}}, ResultConflict},
		{"attempt_id retry", "", query{in: AcquireInput{Fingerprint: ptr("fp"), Operation: ptr("charge"), AttemptID: ptr("att")}}, ResultAdmitted},
		{"attempt_id from another key", "", query{in: AcquireInput{Fingerprint: ptr("fp"), Operation: ptr("charge"), AttemptID: ptr("att")}, otherKey: true}, ResultDuplicate},
		{"other attempt_id", "", query{in: AcquireInput{Fingerprint: ptr("fp"), Operation: ptr("charge"), AttemptID: ptr("att-2")}}, ResultDuplicate},
		{"attempt_id retry after success", StateSucceeded, query{in: AcquireInput{Fingerprint: ptr("fp"), Operation: ptr("charge"), AttemptID: ptr("att")}}, ResultDuplicate},
		{"attempt_id retry after failure", StateFailed, query{in: AcquireInput{Fingerprint: ptr("fp"), Operation: ptr("charge"), AttemptID: ptr("att")}}, ResultDuplicate},
		{"attempt_id retry after uncertain", StateUncertain, query{in: AcquireInput{Fingerprint: ptr("fp"), Operation: ptr("charge"), AttemptID: ptr("att")}}, ResultDuplicate},
	}
	eachDB(t, func(t *testing.T, b *testBundle) {
		b.p.APIKeyID = 1
		for i, c := range live {
			t.Run(c.name, func(t *testing.T) {
				key := fmt.Sprintf("rules-live-%d", i)
				holder, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: key, TTLSeconds: 600, Fingerprint: ptr("fp"),
					Operation: ptr("charge"), AttemptID: ptr("att")})
				require.NoError(t, err)
				if c.outcome != "" {
					mustRecord(t, b, holder, OutcomeInput{Status: c.outcome})
				}
				p := b.p
				if c.q.otherKey {
					p.APIKeyID = 2
				}
				in := c.q.in
				in.Key, in.TTLSeconds = key, 600
				h := opRow(t, b, holder.OperationID)
				rule, readmit := answerOnLiveHold(&h, in, p.APIKeyID)
				require.Equal(t, c.want, rule, "the rule")

				acq, err := b.adm.Acquire(bg, p, in)
				got := ""
				switch {
				case err == ErrFingerprintMismatch:
					got = ResultConflict
				case err != nil:
					t.Fatalf("acquire: %v", err)
				case acq.Admitted:
					got = ResultAdmitted
					require.True(t, acq.Readmitted)
					require.Equal(t, holder.OperationID, acq.OperationID)
				default:
					got = ResultDuplicate
					require.Equal(t, holder.OperationID, acq.Operation.ID)
				}
				require.Equal(t, rule, got, "the store")
				require.Equal(t, readmit, got == ResultAdmitted)
				require.Equal(t, got, newestAttemptResult(t, b, key), "the attempt is logged with the decision")
			})
		}
	})

	ended := []struct {
		name     string
		outcome  string // recorded before the hold ends ("" for none)
		released bool   // released instead of expiring
		want     bool   // the new attempt is told about the previous operation
	}{
		{"expired in_progress", "", false, true},
		{"expired succeeded", StateSucceeded, false, true},
		{"expired failed", StateFailed, false, false},
		{"expired uncertain", StateUncertain, false, true},
		{"released", "", true, false},
	}
	eachDB(t, func(t *testing.T, b *testBundle) {
		for i, c := range ended {
			t.Run(c.name, func(t *testing.T) {
				key := fmt.Sprintf("rules-ended-%d", i)
				first := mustAcquire(t, b, key, 600)
				if c.outcome != "" {
					mustRecord(t, b, first, OutcomeInput{Status: c.outcome})
				}
				if c.released {
					_, err := release(b, first)
					require.NoError(t, err)
				} else {
					require.NoError(t, b.db.Model(&models.IdemKey{}).Where("tenant_id = ? AND key = ?", b.p.TenantID, key).
						Update("expires_at", first.ExpiresAt.Add(-700e9)).Error)
				}
				acq := mustAcquire(t, b, key, 600)
				require.Equal(t, first.FencingToken+1, acq.FencingToken)
				prev := opRow(t, b, first.OperationID)
				if c.outcome == "" && !c.released {
					// The expiry rule, as both stores apply it in the takeover's transaction.
					require.Equal(t, StateUncertain, prev.State)
					require.Equal(t, ReasonTTLExpired, deref(prev.StateReason))
					var evs []models.Event
					require.NoError(t, b.db.Where("operation_id = ?", prev.ID).Order("id").Find(&evs).Error)
					require.NotEmpty(t, evs)
					last := evs[len(evs)-1]
					require.Equal(t, [3]string{EventStateChanged, ActorSystem, expiryDetail}, [3]string{last.Kind, last.Actor, last.Detail})
				}
				require.Equal(t, c.want, mayDuplicateEffect(prev.State), "the rule")
				require.Equal(t, c.want, acq.PreviousOperation != nil, "the store")
				if c.want {
					require.Equal(t, prev.ID, acq.PreviousOperation.ID)
					require.Equal(t, prev.State, acq.PreviousOperation.State)
				}
			})
		}
	})
}

// newestAttemptResult is the result of the newest attempt logged for key in b's tenant.
func newestAttemptResult(t *testing.T, b *testBundle, key string) string {
	t.Helper()
	var a models.Attempt
	require.NoError(t, b.db.Where("tenant_id = ? AND key = ?", b.p.TenantID, key).Order("id DESC").Take(&a).Error)
	return a.Result
}

// TestOutcomeTransitions states the outcome state machine as a table, against the rule alone;
// the stores' side is the state-machine tests (state_machine_test.go), on both dialects.
func TestOutcomeTransitions(t *testing.T) {
	for _, c := range []struct {
		state           string
		hasOutcome      bool
		same            bool
		status          string
		release         bool
		want            outcomeMove
		wantTransitionE bool
	}{
		{StateInProgress, false, false, StateSucceeded, false, moveRecord, false},
		{StateInProgress, false, false, StateFailed, true, moveRecord, false},
		{StateInProgress, false, false, StateUncertain, false, moveRecord, false},
		{StateUncertain, false, false, StateUncertain, false, moveRecord, false}, // the reaper's: caller's details once
		{StateUncertain, true, true, StateUncertain, false, moveNone, false},
		{StateUncertain, true, false, StateUncertain, false, moveNone, true},
		{StateUncertain, true, false, StateSucceeded, false, moveRecord, false}, // reconciliation
		{StateFailed, true, true, StateFailed, false, moveNone, false},
		{StateFailed, true, true, StateFailed, true, moveReleaseFailed, false},
		{StateFailed, true, false, StateSucceeded, false, moveNone, true},
		{StateSucceeded, true, true, StateSucceeded, false, moveNone, false},
		{StateSucceeded, true, false, StateFailed, false, moveNone, true},
		{StateReleased, true, false, StateSucceeded, false, moveNone, true},
	} {
		got, err := outcomeTransition(c.state, c.hasOutcome, c.same, c.status, c.release)
		require.Equal(t, c.want, got, "%+v", c)
		require.Equal(t, c.wantTransitionE, err == ErrInvalidTransition, "%+v: %v", c, err)
	}
}
