package services

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
)

// TestAdmissionRulesAgree holds both stores to the rules of rules.go: one table of cases, each
// asked of the Go rule (from the rows as stored) and of the store, on both dialects, through
// each way an acquire reaches the store (alone, and in a batch: PostgreSQL's
// idemgate_acquire_batch states the rules again), for each way a key can be held (a live
// hold, and hold_until_reconciled past the TTL). The want column checks the rule itself for a
// live hold.
func TestAdmissionRulesAgree(t *testing.T) {
	type query struct {
		in       AcquireInput
		otherKey bool // sent by another API key of the tenant
	}
	// Answers: admitted (the creating key's attempt_id retry, readmitted), duplicate, conflict,
	// or readmitFresh (the key was free: a new operation).
	const readmitFresh = "admitted anew"
	cases := []struct {
		name    string
		outcome string // recorded on the holder before the query ("" for none)
		q       query
		want    string // the rule's answer for a live hold
	}{
		{"same request", "", query{in: AcquireInput{Fingerprint: ptr("fp"), Operation: ptr("charge")}}, ResultDuplicate},
		{"other fingerprint", "", query{in: AcquireInput{Fingerprint: ptr("other"), Operation: ptr("charge")}}, ResultConflict},
		{"no fingerprint", "", query{in: AcquireInput{Operation: ptr("charge")}}, ResultConflict},
		{"no operation name", "", query{in: AcquireInput{Fingerprint: ptr("fp")}}, ResultConflict},
		{"other operation name", "", query{in: AcquireInput{Fingerprint: ptr("fp"), Operation: ptr("refund")}}, ResultConflict},
		{"operation name differs in case", "", query{in: AcquireInput{Fingerprint: ptr("fp"), Operation: ptr("Charge")}}, ResultConflict},
		{"attempt_id retry", "", query{in: AcquireInput{Fingerprint: ptr("fp"), Operation: ptr("charge"), AttemptID: ptr("att")}}, ResultAdmitted},
		{"attempt_id retry of another request", "", query{in: AcquireInput{Fingerprint: ptr("other"), Operation: ptr("charge"), AttemptID: ptr("att")}}, ResultConflict},
		{"attempt_id from another key", "", query{in: AcquireInput{Fingerprint: ptr("fp"), Operation: ptr("charge"), AttemptID: ptr("att")}, otherKey: true}, ResultDuplicate},
		{"other attempt_id", "", query{in: AcquireInput{Fingerprint: ptr("fp"), Operation: ptr("charge"), AttemptID: ptr("att-2")}}, ResultDuplicate},
		{"attempt_id retry after success", StateSucceeded, query{in: AcquireInput{Fingerprint: ptr("fp"), Operation: ptr("charge"), AttemptID: ptr("att")}}, ResultDuplicate},
		{"attempt_id retry after failure", StateFailed, query{in: AcquireInput{Fingerprint: ptr("fp"), Operation: ptr("charge"), AttemptID: ptr("att")}}, ResultDuplicate},
		{"attempt_id retry after uncertain", StateUncertain, query{in: AcquireInput{Fingerprint: ptr("fp"), Operation: ptr("charge"), AttemptID: ptr("att")}}, ResultDuplicate},
		{"other request after success", StateSucceeded, query{in: AcquireInput{Fingerprint: ptr("other"), Operation: ptr("charge")}}, ResultConflict},
		{"other request after failure", StateFailed, query{in: AcquireInput{Fingerprint: ptr("other"), Operation: ptr("charge")}}, ResultConflict},
	}
	holds := []struct {
		name     string
		onExpiry string
		pastTTL  bool
	}{{"live hold", OnExpiryReadmit, false}, {"held until reconciled past its TTL", OnExpiryHold, true}}
	paths := []struct {
		name    string
		acquire func(b *testBundle, p Principal, in AcquireInput) (*Acquisition, error)
	}{
		{"acquire", func(b *testBundle, p Principal, in AcquireInput) (*Acquisition, error) {
			return b.adm.Acquire(bg, p, in)
		}},
		{"batch", func(b *testBundle, p Principal, in AcquireInput) (*Acquisition, error) {
			items, err := b.adm.AcquireBatch(bg, p, []AcquireInput{in})
			if err != nil {
				return nil, err
			}
			return items[0].Acquisition, items[0].Err
		}},
	}
	for _, c := range cases { // the rule alone, on a live hold
		h := models.Operation{OperationName: ptr("charge"), Fingerprint: ptr("fp"), AttemptID: ptr("att"),
			APIKeyID: ptr(int64(1)), State: StateInProgress}
		if c.outcome != "" {
			h.State = c.outcome
		}
		keyID := int64(1)
		if c.q.otherKey {
			keyID = 2
		}
		got, readmit := answerOnLiveHold(&h, c.q.in, keyID)
		require.Equal(t, c.want, got, c.name)
		require.Equal(t, c.want == ResultAdmitted, readmit, c.name)
	}
	eachDB(t, func(t *testing.T, b *testBundle) {
		b.p.APIKeyID = 1
		for hi, hold := range holds {
			for pi, path := range paths {
				for i, c := range cases {
					t.Run(hold.name+"/"+path.name+"/"+c.name, func(t *testing.T) {
						key := fmt.Sprintf("rules-%d-%d-%d", hi, pi, i)
						holder, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: key, TTLSeconds: 600, Fingerprint: ptr("fp"),
							Operation: ptr("charge"), AttemptID: ptr("att"), OnExpiry: ptr(hold.onExpiry)})
						require.NoError(t, err)
						if c.outcome != "" {
							mustRecord(t, b, holder, OutcomeInput{Status: c.outcome})
						}
						if hold.pastTTL {
							b.elapse(t, 700*time.Second, key)
						}
						p := b.p
						if c.q.otherKey {
							p.APIKeyID = 2
						}
						in := c.q.in
						in.Key, in.TTLSeconds = key, 600
						h := opRow(t, b, holder.OperationID)
						var rule string
						switch {
						case !hold.pastTTL:
							rule, _ = answerOnLiveHold(&h, in, p.APIKeyID)
						case !holdsUntilReconciled(&h):
							rule = readmitFresh
						case sameRequest(&h, in):
							rule = ResultDuplicate
						default:
							rule = ResultConflict
						}

						acq, err := path.acquire(b, p, in)
						var de *Error
						got := ""
						switch {
						case err == ErrFingerprintMismatch:
							got = ResultConflict
						case errors.As(err, &de) && de.Code == CodeOutcomeUncertain:
							got = ResultDuplicate // answered about the holder, as 409
							require.Equal(t, holder.OperationID, de.Operation.ID)
						case err != nil:
							t.Fatalf("acquire: %v", err)
						case acq.Admitted && acq.OperationID != holder.OperationID:
							got = readmitFresh
							require.False(t, acq.Readmitted)
						case acq.Admitted:
							got = ResultAdmitted
							require.True(t, acq.Readmitted)
						default:
							got = ResultDuplicate
							require.Equal(t, holder.OperationID, acq.Operation.ID)
						}
						require.Equal(t, rule, got, "the store")
						logged := got
						if got == readmitFresh {
							logged = ResultAdmitted
						}
						require.Equal(t, logged, newestAttemptResult(t, b, key), "the attempt is logged with the decision")
					})
				}
			}
		}
	})

}

// TestDuplicateEffectRule holds every place that decides "may this admission duplicate an
// earlier effect" to duplicateEffectStates: for each way a key's previous operation can end,
// the acquire that takes the key over names it as previous_operation, the new operation's
// possible_duplicate_effect flag is set (operations_possible_duplicate) and the webhook outbox
// gets operation.possible_duplicate_effect (operations_webhook_admitted) exactly when the
// rule says so; and when the previous operation later moves to each other state, the flag
// follows the rule (operations_reflag_later). On both dialects, whose SQL states the rule
// apart from Go.
func TestDuplicateEffectRule(t *testing.T) {
	require.Equal(t, []bool{false, true, false, true, false}, []bool{mayDuplicateEffect(StateInProgress),
		mayDuplicateEffect(StateSucceeded), mayDuplicateEffect(StateFailed), mayDuplicateEffect(StateUncertain),
		mayDuplicateEffect(StateReleased)}, "the rule")
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
		ep := newEndpoint(t, b, "https://hooks.example/rules", EventPossibleDuplicateEffect)
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
					b.elapse(t, 700*time.Second, key)
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
				require.Equal(t, c.want, acq.PreviousOperation != nil, "the acquire's answer")
				if c.want {
					require.Equal(t, prev.ID, acq.PreviousOperation.ID)
					require.Equal(t, prev.State, acq.PreviousOperation.State)
				}
				require.Equal(t, c.want, flagOf(t, b, acq.OperationID), "the audit's flag")
				var events int64
				require.NoError(t, b.db.Model(&models.WebhookEvent{}).Where("endpoint_id = ? AND operation_id = ?",
					ep.Endpoint.ID, acq.OperationID).Count(&events).Error)
				require.Equal(t, c.want, events == 1, "the webhook event (%d)", events)

				for _, state := range []string{StateSucceeded, StateFailed, StateUncertain, StateReleased, StateInProgress} {
					require.NoError(t, b.db.Exec("UPDATE operations SET state = ? WHERE id = ?", state, prev.ID).Error)
					require.Equal(t, mayDuplicateEffect(state), flagOf(t, b, acq.OperationID), "flag after the previous operation became %s", state)
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
