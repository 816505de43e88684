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
