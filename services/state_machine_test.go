package services

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The state machine of docs/reference.md §3, driven through RecordOutcome and Release on both dialects.

// Values recorded while setting up a state; the attempted outcomes below always use others, so
// they are never "the same outcome again".
var (
	setupSucceeded = OutcomeInput{Status: StateSucceeded, Receipt: ptr("r-setup"), Response: json.RawMessage(`{"ok":true}`)}
	setupFailed    = OutcomeInput{Status: StateFailed, Receipt: ptr("r-setup"), Response: json.RawMessage(`{"error":"declined"}`)}
	setupUncertain = OutcomeInput{Status: StateUncertain, Receipt: ptr("r-setup")}
)

// intoState returns a fresh operation (with a live 60 s hold unless released) in one of the
// setup states.
func intoState(t *testing.T, b *testBundle, key, state string) *Acquisition {
	t.Helper()
	acq := mustAcquire(t, b, key, 60)
	switch state {
	case "in_progress":
	case "succeeded":
		mustRecord(t, b, acq, setupSucceeded)
	case "failed":
		mustRecord(t, b, acq, setupFailed)
	case "uncertain":
		mustRecord(t, b, acq, setupUncertain)
	case "released":
		_, err := release(b, acq)
		require.NoError(t, err)
	case "released_failed":
		in := setupFailed
		in.Release = true
		mustRecord(t, b, acq, in)
	default:
		t.Fatalf("unknown setup state %q", state)
	}
	return acq
}

// attempted outcomes, all with a receipt no setup uses.
var attempts = map[string]OutcomeInput{
	"succeeded":      {Status: StateSucceeded, Receipt: ptr("r-new"), Response: json.RawMessage(`{"id":"ch_1"}`), Note: ptr("n")},
	"failed":         {Status: StateFailed, Receipt: ptr("r-new")},
	"uncertain":      {Status: StateUncertain, Receipt: ptr("r-new")},
	"failed+release": {Status: StateFailed, Receipt: ptr("r-new"), Release: true},
}

// transition is one row of the matrix: from a setup state, an attempted outcome leads to a
// state (and outcome status), or is refused when to is "".
type transition struct {
	from, attempt string
	to            string
	outcome       string
	events        int // events the transition appends
}

var outcomeMatrix = []transition{
	{"in_progress", "succeeded", StateSucceeded, StateSucceeded, 1},
	{"in_progress", "failed", StateFailed, StateFailed, 1},
	{"in_progress", "uncertain", StateUncertain, StateUncertain, 1},
	{"in_progress", "failed+release", StateReleased, StateFailed, 2},
	{"uncertain", "succeeded", StateSucceeded, StateSucceeded, 1},
	{"uncertain", "failed", StateFailed, StateFailed, 1},
	{"uncertain", "failed+release", StateReleased, StateFailed, 2},
	{"uncertain", "uncertain", "", "", 0}, // a different uncertain outcome after one was recorded
	{"succeeded", "succeeded", "", "", 0},
	{"succeeded", "failed", "", "", 0},
	{"succeeded", "uncertain", "", "", 0},
	{"succeeded", "failed+release", "", "", 0},
	{"failed", "succeeded", "", "", 0},
	{"failed", "failed", "", "", 0},
	{"failed", "uncertain", "", "", 0},
	{"failed", "failed+release", "", "", 0}, // release only with the same failed outcome
	{"released", "succeeded", "", "", 0},
	{"released", "failed", "", "", 0},
	{"released", "uncertain", "", "", 0},
	{"released", "failed+release", "", "", 0},
	{"released_failed", "succeeded", "", "", 0},
	{"released_failed", "failed", "", "", 0},
	{"released_failed", "uncertain", "", "", 0},
	{"released_failed", "failed+release", "", "", 0},
}

func TestOutcomeTransitionMatrix(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		for i, tr := range outcomeMatrix {
			t.Run(tr.from+"->"+tr.attempt, func(t *testing.T) {
				acq := intoState(t, b, fmt.Sprintf("sm-%d", i), tr.from)
				before := snapshot(t, b, acq.OperationID)
				in := attempts[tr.attempt]
				op, err := record(b, acq, in)
				if tr.to == "" {
					require.ErrorIs(t, err, ErrInvalidTransition)
					require.Nil(t, op)
					require.Equal(t, before, snapshot(t, b, acq.OperationID), "a refused transition changed something")
					return
				}
				require.NoError(t, err)
				require.Equal(t, tr.to, op.State)
				require.NotNil(t, op.Outcome)
				require.Equal(t, tr.outcome, op.Outcome.Status)
				require.Equal(t, "r-new", deref(op.Outcome.Receipt))
				require.Equal(t, "api:"+b.p.Prefix, op.Outcome.RecordedBy)
				require.False(t, op.Outcome.RecordedAt.IsZero())
				if in.Response != nil {
					require.JSONEq(t, string(in.Response), string(op.Outcome.Response))
				} else {
					require.Nil(t, op.Outcome.Response)
				}

				after := snapshot(t, b, acq.OperationID)
				require.Equal(t, tr.to, after.Op.State)
				require.Equal(t, tr.outcome, deref(after.Op.OutcomeStatus))
				require.Len(t, after.Events, len(before.Events)+tr.events)
				require.Equal(t, before.Attempts, after.Attempts)
				require.Nil(t, after.Op.StateReason)
				if tr.to == StateUncertain {
					require.Nil(t, after.Op.EndedAt, "uncertain is not an end: retention must keep it")
				} else {
					require.NotNil(t, after.Op.EndedAt)
				}
				k, err := b.reads.GetKey(bg, b.p.TenantID, acq.Key)
				require.NoError(t, err)
				if tr.to == StateReleased {
					require.False(t, k.Held)
					require.False(t, op.Held)
					require.Nil(t, after.Key.HolderOperationID)
					require.NotNil(t, op.ReleasedAt)
				} else {
					require.True(t, k.Held)
					require.True(t, op.Held)
					require.Equal(t, acq.OperationID, deref(after.Key.HolderOperationID))
				}
			})
		}
	})
}

// An operation left in_progress when its hold expired becomes uncertain (reason
// ttl_expired_without_outcome) when another attempt takes the key over; reconciliation may then
// move it to succeeded or failed, and the caller may record its own uncertain outcome once.
func TestOutcomeFromExpiredUncertain(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		names := []string{"succeeded", "failed", "uncertain", "failed+release"}
		old := map[string]*Acquisition{}
		for _, n := range names {
			old[n] = mustAcquire(t, b, "exp-"+n, 1)
		}
		b.elapse(t, time.Second)
		for _, n := range names {
			next := mustAcquire(t, b, "exp-"+n, 60)
			require.EqualValues(t, 2, next.FencingToken)
			require.Equal(t, &PreviousOperation{ID: old[n].OperationID, State: StateUncertain, FencingToken: 1}, next.PreviousOperation)
			m := opRow(t, b, old[n].OperationID)
			require.Equal(t, StateUncertain, m.State)
			require.Equal(t, ReasonTTLExpired, deref(m.StateReason))
			require.Nil(t, m.OutcomeStatus)

			// Reconciling the old operation never touches the new hold.
			op, err := record(b, old[n], attempts[n])
			require.NoError(t, err, n)
			// failed+release stays failed: the key was taken over, so there is nothing to release.
			want := map[string]string{"succeeded": StateSucceeded, "failed": StateFailed,
				"uncertain": StateUncertain, "failed+release": StateFailed}[n]
			require.Equal(t, want, op.State)
			require.Equal(t, attempts[n].Status, op.Outcome.Status)
			require.False(t, op.Held)
			k, err := b.reads.GetKey(bg, b.p.TenantID, "exp-"+n)
			require.NoError(t, err)
			require.True(t, k.Held)
			require.Equal(t, next.OperationID, k.Operation.ID)
			require.Equal(t, StateInProgress, k.Operation.State)

			d, err := b.reads.GetOperation(bg, b.p.TenantID, old[n].OperationID)
			require.NoError(t, err)
			require.Equal(t, EventStateChanged, d.Events[0].Kind)
			require.Equal(t, ActorSystem, d.Events[0].Actor)
			require.Equal(t, EventOutcome, d.Events[1].Kind)
		}
		// The uncertain outcome recorded over the system's mark can be followed by reconciliation.
		op, err := record(b, old["uncertain"], OutcomeInput{Status: StateSucceeded, Receipt: ptr("late")})
		require.NoError(t, err)
		require.Equal(t, StateSucceeded, op.State)
	})
}

// docs/reference.md §3: recording the same outcome again (equal status, receipt and response, the
// response compared as JSON) succeeds and changes nothing; the note is not part of "same".
func TestOutcomeSameAgainChangesNothing(t *testing.T) {
	t.Parallel()
	first := OutcomeInput{Receipt: ptr("rcpt"), Note: ptr("first note"),
		Response: json.RawMessage(`{"b":{"y":[1,2.5,"x"],"x":null},"a":"é\u00e9","n":1e2,"z":-0,"t":true}`)}
	again := OutcomeInput{Receipt: ptr("rcpt"), Note: ptr("another note"),
		Response: json.RawMessage("{ \"z\" : 0, \"t\":true,\n\t\"a\": \"\u00e9\u00e9\", \"n\": 100, \"b\": {\"x\": null, \"y\": [1, 2.50, \"\\u0078\"]} }")}
	eachDB(t, func(t *testing.T, b *testBundle) {
		for _, tc := range []struct {
			name, status string
			release      bool
			wantState    string
		}{
			{"succeeded", StateSucceeded, false, StateSucceeded},
			{"failed", StateFailed, false, StateFailed},
			{"uncertain", StateUncertain, false, StateUncertain},
			{"failed+release", StateFailed, true, StateReleased},
		} {
			t.Run(tc.name, func(t *testing.T) {
				acq := mustAcquire(t, b, "same-"+tc.name, 60)
				in := first
				in.Status, in.Release = tc.status, tc.release
				op1 := mustRecord(t, b, acq, in)
				require.Equal(t, tc.wantState, op1.State)
				before := snapshot(t, b, acq.OperationID)

				in = again
				in.Status, in.Release = tc.status, tc.release
				op2, err := record(b, acq, in)
				require.NoError(t, err, "the same outcome again must succeed")
				require.Equal(t, before, snapshot(t, b, acq.OperationID), "the same outcome again changed something")
				require.Equal(t, tc.wantState, op2.State)
				require.Equal(t, "first note", deref(op2.Outcome.Note))
				require.Equal(t, op1.Outcome.RecordedAt, op2.Outcome.RecordedAt)
				require.JSONEq(t, string(op1.Outcome.Response), string(op2.Outcome.Response))

				// A repeat of a failed+release outcome without release is the same outcome too.
				if tc.release {
					in.Release = false
					_, err = record(b, acq, in)
					require.NoError(t, err)
					require.Equal(t, before, snapshot(t, b, acq.OperationID))
				}

				// Anything that differs in status, receipt or response is another outcome.
				for name, diff := range map[string]OutcomeInput{
					"receipt":     {Status: tc.status, Receipt: ptr("rcpt2"), Response: first.Response},
					"no receipt":  {Status: tc.status, Response: first.Response},
					"response":    {Status: tc.status, Receipt: ptr("rcpt"), Response: json.RawMessage(`{"n":101}`)},
					"no response": {Status: tc.status, Receipt: ptr("rcpt")},
				} {
					_, err := record(b, acq, diff)
					require.ErrorIs(t, err, ErrInvalidTransition, name)
					require.Equal(t, before, snapshot(t, b, acq.OperationID), name)
				}
			})
		}
	})
}

// failed -> released, via an outcome with release:true (repeating the failed outcome) and via
// POST release.
func TestFailedToReleased(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		for _, via := range []string{"outcome", "release"} {
			t.Run(via, func(t *testing.T) {
				acq := intoState(t, b, "failed-then-"+via, "failed")
				before := snapshot(t, b, acq.OperationID)
				var op *Operation
				var err error
				if via == "outcome" {
					in := setupFailed
					in.Release = true
					op, err = record(b, acq, in)
				} else {
					op, err = b.adm.Release(bg, b.p, ReleaseInput{Key: acq.Key, OwnerToken: acq.OwnerToken, Reason: ptr("rolled back")})
				}
				require.NoError(t, err)
				require.Equal(t, StateReleased, op.State)
				require.False(t, op.Held)
				require.NotNil(t, op.ReleasedAt)
				// The recorded failure stays the operation's outcome.
				require.Equal(t, StateFailed, op.Outcome.Status)
				require.Equal(t, "r-setup", deref(op.Outcome.Receipt))
				require.JSONEq(t, `{"error":"declined"}`, string(op.Outcome.Response))
				require.Equal(t, before.Op.OutcomeAt, opRow(t, b, acq.OperationID).OutcomeAt)
				after := snapshot(t, b, acq.OperationID)
				require.Len(t, after.Events, len(before.Events)+1)
				require.Equal(t, EventReleased, after.Events[len(after.Events)-1].Kind)
				require.Nil(t, after.Key.HolderOperationID)

				next := mustAcquire(t, b, acq.Key, 60)
				require.EqualValues(t, 2, next.FencingToken)
				require.Nil(t, next.PreviousOperation)
			})
		}
	})
}

// docs/reference.md §4: failed with release:true leaves the operation released with outcome failed and
// frees the key in the same transaction.
func TestOutcomeFailedWithReleaseFreesKey(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acq := mustAcquire(t, b, "fail-release", 60)
		op := mustRecord(t, b, acq, OutcomeInput{Status: StateFailed, Receipt: ptr("declined"),
			Note: ptr("card declined"), Release: true})
		require.Equal(t, StateReleased, op.State)
		require.Equal(t, StateFailed, op.Outcome.Status)
		require.Equal(t, "card declined", deref(op.ReleaseReason))
		require.False(t, op.Held)

		k, err := b.reads.GetKey(bg, b.p.TenantID, "fail-release")
		require.NoError(t, err)
		require.False(t, k.Held)
		require.Nil(t, k.ExpiresAt)
		require.Equal(t, StateReleased, k.Operation.State)

		next := mustAcquire(t, b, "fail-release", 60)
		require.EqualValues(t, 2, next.FencingToken)
		require.Nil(t, next.PreviousOperation)
		// The old owner can no longer release the key it gave up.
		_, err = release(b, acq)
		require.ErrorIs(t, err, ErrNotOwner)
	})
}

// Release refusals per state (POST release is the other way into "released").
func TestReleaseByState(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		for _, tc := range []struct {
			from string
			want error
		}{
			{"in_progress", nil},
			{"failed", nil},
			{"succeeded", ErrEffectConfirmed},
			{"uncertain", ErrOutcomeUncertain},
			{"released", ErrKeyNotHeld},
			{"released_failed", ErrKeyNotHeld},
		} {
			t.Run(tc.from, func(t *testing.T) {
				acq := intoState(t, b, "rel-"+tc.from, tc.from)
				before := snapshot(t, b, acq.OperationID)
				op, err := release(b, acq)
				if tc.want != nil {
					require.ErrorIs(t, err, tc.want)
					require.Nil(t, op)
					require.Equal(t, before, snapshot(t, b, acq.OperationID))
					return
				}
				require.NoError(t, err)
				require.Equal(t, StateReleased, op.State)
				after := snapshot(t, b, acq.OperationID)
				require.Equal(t, StateReleased, after.Op.State)
				require.Nil(t, after.Key.HolderOperationID)
				require.Nil(t, after.Key.ExpiresAt)
				require.NotNil(t, after.Op.EndedAt)
			})
		}
	})
}
