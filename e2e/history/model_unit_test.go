package history

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"
)

// Hand-built histories: the model's verdicts on cases small enough to read.

const ms = int64(time.Millisecond)

func acq(client int, call, ret int64, fp string, out callOutput) porcupine.Operation {
	out.Ret = ret
	return porcupine.Operation{ClientId: client, Call: call, Return: ret,
		Input:  callInput{Kind: kindAcquire, Key: "k", Name: "charge", FP: fp, TTL: 60, Call: call},
		Output: out}
}

func rel(client int, call, ret int64, op string, bad bool, out callOutput) porcupine.Operation {
	out.Ret = ret
	return porcupine.Operation{ClientId: client, Call: call, Return: ret,
		Input:  callInput{Kind: kindRelease, Key: "k", Op: op, BadToken: bad, Call: call},
		Output: out}
}

func admitted(id string, fencing int64) callOutput {
	return callOutput{Status: 201, OpID: id, Fencing: fencing, Exp: int64(time.Hour)}
}

func checkHistory(t *testing.T, ops ...porcupine.Operation) porcupine.CheckResult {
	t.Helper()
	return porcupine.CheckOperationsTimeout(keyModel(modelOptions{}), ops, 10*time.Second)
}

func TestModelTwoOverlappingAdmissionsIllegal(t *testing.T) {
	require.Equal(t, porcupine.Illegal, checkHistory(t,
		acq(0, 0, 10*ms, "a", admitted("op1", 1)),
		acq(1, 1*ms, 9*ms, "a", admitted("op2", 1))))
	// Even with distinct, consecutive fencing tokens, a live hold cannot be taken over.
	require.Equal(t, porcupine.Illegal, checkHistory(t,
		acq(0, 0, 10*ms, "a", admitted("op1", 1)),
		acq(1, 20*ms, 30*ms, "a", admitted("op2", 2))))
}

func TestModelSequentialAcquireReleaseAcquireLegal(t *testing.T) {
	require.Equal(t, porcupine.Ok, checkHistory(t,
		acq(0, 0, 10*ms, "a", admitted("op1", 1)),
		acq(1, 11*ms, 12*ms, "a", callOutput{Status: 200, OpID: "op1", State: "in_progress"}),
		acq(2, 11*ms, 12*ms, "b", callOutput{Status: 422, Code: "fingerprint_mismatch"}),
		rel(0, 20*ms, 30*ms, "op1", false, callOutput{Status: 200, State: "released"}),
		acq(1, 40*ms, 50*ms, "b", admitted("op2", 2))))
}

func TestModelExpiryAllowsTakeover(t *testing.T) {
	first := admitted("op1", 1)
	first.Exp = 100 * ms
	require.Equal(t, porcupine.Ok, checkHistory(t,
		acq(0, 0, 10*ms, "a", first),
		acq(1, 1200*ms, 1210*ms, "b", admitted("op2", 2)),
		rel(0, 1300*ms, 1310*ms, "op1", false, callOutput{Status: 409, Code: "not_owner"})))
	// A duplicate answer long after the hold expired is wrong.
	require.Equal(t, porcupine.Illegal, checkHistory(t,
		acq(0, 0, 10*ms, "a", first),
		acq(1, 1500*ms, 1510*ms, "a", callOutput{Status: 200, OpID: "op1", State: "in_progress"})))
}

func TestModelWrongTokenNeverReleases(t *testing.T) {
	require.Equal(t, porcupine.Illegal, checkHistory(t,
		acq(0, 0, 10*ms, "a", admitted("op1", 1)),
		rel(1, 20*ms, 30*ms, "op1", true, callOutput{Status: 200, State: "released"})))
}

func TestModelUnknownOutcomes(t *testing.T) {
	// An acquire with no answer may have admitted an operation nobody saw: the next admission
	// then carries fencing token 2, and a duplicate may name the unseen operation.
	unknown := acq(0, 0, 1000*ms, "a", callOutput{Unknown: true})
	require.Equal(t, porcupine.Ok, checkHistory(t, unknown,
		acq(1, 10*ms, 20*ms, "a", callOutput{Status: 200, OpID: "ghost", State: "in_progress"})))
	require.Equal(t, porcupine.Ok, checkHistory(t, unknown,
		acq(1, 10*ms, 20*ms, "a", admitted("op1", 1))))
	// But it cannot explain a repeated fencing token.
	require.Equal(t, porcupine.Illegal, checkHistory(t, unknown,
		acq(1, 10*ms, 20*ms, "a", admitted("op1", 1)),
		acq(2, 30*ms, 40*ms, "a", admitted("op2", 1))))
}

// TestModelLostAdmissions: an acquire whose answer was lost but which the database shows
// admitted (resolveLostAcquires) is an admission with a known id and fencing token, so it
// explains less than an unknown acquire does.
func TestModelLostAdmissions(t *testing.T) {
	lost := acq(0, 0, 1000*ms, "a", callOutput{Lost: true, OpID: "op1", Fencing: 1})
	// Its expiry is unknown: a later admission or a duplicate naming it are both possible.
	require.Equal(t, porcupine.Ok, checkHistory(t, lost,
		acq(1, 10*ms, 20*ms, "a", admitted("op2", 2))))
	require.Equal(t, porcupine.Ok, checkHistory(t, lost,
		acq(1, 10*ms, 20*ms, "a", callOutput{Status: 200, OpID: "op1", State: "in_progress"})))
	// A duplicate naming an operation nobody admitted is wrong, where an unknown acquire
	// (TestModelUnknownOutcomes) could explain it.
	require.Equal(t, porcupine.Illegal, checkHistory(t, lost,
		acq(1, 10*ms, 20*ms, "a", callOutput{Status: 200, OpID: "ghost", State: "in_progress"})))
	// It took a fencing token: nobody else may have it, and it cannot be skipped.
	require.Equal(t, porcupine.Illegal, checkHistory(t, lost,
		acq(1, 10*ms, 20*ms, "a", admitted("op2", 1)),
		acq(2, 30*ms, 40*ms, "a", admitted("op3", 2))))
	require.Equal(t, porcupine.Illegal, checkHistory(t,
		acq(0, 0, 10*ms, "a", callOutput{Lost: true, OpID: "op1", Fencing: 2})))
	// It admits only a free key: not under a live 201's hold that outlasts the history.
	require.Equal(t, porcupine.Illegal, checkHistory(t,
		acq(0, 0, 10*ms, "a", admitted("op1", 1)),
		acq(1, 20*ms, 1000*ms, "a", callOutput{Lost: true, OpID: "op2", Fencing: 2})))
}

// TestModelTornDuplicate: a duplicate reporting its operation released (after the hold was
// gone) is refused by the strict model and accepted only with the documented relaxation.
func TestModelTornDuplicate(t *testing.T) {
	h := []porcupine.Operation{
		acq(0, 0, 10*ms, "a", admitted("op1", 1)),
		rel(0, 20*ms, 30*ms, "op1", false, callOutput{Status: 200, State: "released"}),
		acq(1, 15*ms, 35*ms, "a", callOutput{Status: 200, OpID: "op1", State: "released"}),
	}
	require.Equal(t, porcupine.Illegal, checkHistory(t, h...))
	require.Equal(t, porcupine.Ok, porcupine.CheckOperationsTimeout(keyModel(modelOptions{tornDuplicate: true}), h, 10*time.Second))
}

func renew(client int, call, ret int64, op string, bad bool, out callOutput) porcupine.Operation {
	out.Ret = ret
	return porcupine.Operation{ClientId: client, Call: call, Return: ret,
		Input:  callInput{Kind: kindRenew, Key: "k", Op: op, BadToken: bad, Lease: 1, Call: call},
		Output: out}
}

// leased is a 201 with a lease ending at lexp and the hold at exp.
func leased(id string, fencing, lexp, exp int64, hold bool) (callOutput, bool) {
	return callOutput{Status: 201, OpID: id, Fencing: fencing, Exp: exp, LeaseExp: lexp}, hold
}

func acqHold(client int, call, ret int64, hold bool, out callOutput) porcupine.Operation {
	op := acq(client, call, ret, "a", out)
	in := op.Input.(callInput)
	in.Hold = hold
	op.Input = in
	return op
}

// TestModelLeases: docs/reference.md §8 on hand-built histories.
func TestModelLeases(t *testing.T) {
	first, _ := leased("op1", 1, 1000*ms, 10_000*ms, false)
	// A renew by the owner in time is fine; with a wrong token it must never succeed.
	require.Equal(t, porcupine.Ok, checkHistory(t, acq(0, 0, 10*ms, "a", first),
		renew(0, 500*ms, 510*ms, "op1", false, callOutput{Status: 200, OpID: "op1", LeaseExp: 1510 * ms, Exp: 10_000 * ms})))
	require.Equal(t, porcupine.Illegal, checkHistory(t, acq(0, 0, 10*ms, "a", first),
		renew(1, 500*ms, 510*ms, "op1", true, callOutput{Status: 200, OpID: "op1", LeaseExp: 1510 * ms, Exp: 10_000 * ms})))
	// A renew long after the lease lapsed cannot revive it.
	require.Equal(t, porcupine.Illegal, checkHistory(t, acq(0, 0, 10*ms, "a", first),
		renew(0, 3000*ms, 3010*ms, "op1", false, callOutput{Status: 200, OpID: "op1", LeaseExp: 4010 * ms, Exp: 10_000 * ms})))
	require.Equal(t, porcupine.Ok, checkHistory(t, acq(0, 0, 10*ms, "a", first),
		renew(0, 3000*ms, 3010*ms, "op1", false, callOutput{Status: 409, Code: "lease_expired"})))
	// After the lease, while the TTL protects the key: 409 outcome_uncertain, never a 201 or a
	// 200 reporting it still in progress.
	require.Equal(t, porcupine.Ok, checkHistory(t, acq(0, 0, 10*ms, "a", first),
		acq(1, 3000*ms, 3010*ms, "a", callOutput{Status: 409, Code: "outcome_uncertain", OpID: "op1"})))
	require.Equal(t, porcupine.Illegal, checkHistory(t, acq(0, 0, 10*ms, "a", first),
		acq(1, 3000*ms, 3010*ms, "a", callOutput{Status: 200, OpID: "op1", State: "in_progress"})))
	require.Equal(t, porcupine.Illegal, checkHistory(t, acq(0, 0, 10*ms, "a", first),
		acq(1, 3000*ms, 3010*ms, "a", admitted("op2", 2))))
	// Past the TTL, readmit admits again; hold_until_reconciled refuses until reconciled.
	require.Equal(t, porcupine.Ok, checkHistory(t, acq(0, 0, 10*ms, "a", first),
		acq(1, 12_000*ms, 12_010*ms, "a", admitted("op2", 2))))
	held, hold := leased("op1", 1, 1000*ms, 2000*ms, true)
	require.Equal(t, porcupine.Illegal, checkHistory(t, acqHold(0, 0, 10*ms, hold, held),
		acqHold(1, 5000*ms, 5010*ms, hold, admitted("op2", 2))))
	require.Equal(t, porcupine.Ok, checkHistory(t, acqHold(0, 0, 10*ms, hold, held),
		acqHold(1, 5000*ms, 5010*ms, hold, callOutput{Status: 409, Code: "outcome_uncertain", OpID: "op1"})))
	reconcile := porcupine.Operation{ClientId: 0, Call: 6000 * ms, Return: 6010 * ms,
		Input:  callInput{Kind: kindOutcome, Key: "k", Op: "op1", Status: "failed", Call: 6000 * ms},
		Output: callOutput{Status: 200, OpID: "op1", State: "failed", Ret: 6010 * ms}}
	require.Equal(t, porcupine.Ok, checkHistory(t, acqHold(0, 0, 10*ms, hold, held), reconcile,
		acqHold(1, 7000*ms, 7010*ms, hold, admitted("op2", 2))))
}
