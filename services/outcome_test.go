package services

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// bigResponse returns a JSON string value whose serialized size is exactly n bytes.
func bigResponse(n int) json.RawMessage {
	return json.RawMessage(`"` + strings.Repeat("x", n-2) + `"`)
}

func TestOutcomeRecordsAndStoresResponse(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acq := mustAcquire(t, b, "charge-1", 60)
		op := mustRecord(t, b, acq, OutcomeInput{Status: StateSucceeded, Receipt: ptr("ch_123"),
			Response: json.RawMessage(`{ "charge": "ch_123", "amount": 100 }`), Note: ptr("ok")})
		require.Equal(t, StateSucceeded, op.State)
		require.Equal(t, &Outcome{Status: StateSucceeded, Receipt: ptr("ch_123"), Response: op.Outcome.Response,
			Note: ptr("ok"), RecordedBy: "api:" + b.p.Prefix, RecordedAt: op.Outcome.RecordedAt}, op.Outcome)
		require.JSONEq(t, `{"charge":"ch_123","amount":100}`, string(op.Outcome.Response))
		require.True(t, op.Held)

		// A duplicate is answered with the stored outcome and response.
		dup, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "charge-1", TTLSeconds: 60})
		require.NoError(t, err)
		require.False(t, dup.Admitted)
		require.Equal(t, StateSucceeded, dup.Operation.State)
		require.Equal(t, "ch_123", deref(dup.Operation.Outcome.Receipt))
		require.JSONEq(t, `{"charge":"ch_123","amount":100}`, string(dup.Operation.Outcome.Response))

		d, err := b.reads.GetOperation(bg, b.p.TenantID, acq.OperationID)
		require.NoError(t, err)
		require.Len(t, d.Events, 1)
		require.Equal(t, EventOutcome, d.Events[0].Kind)
		require.Equal(t, "in_progress -> succeeded: outcome succeeded, receipt ch_123", d.Events[0].Detail)
		require.Len(t, d.Attempts, 2)

		// Any JSON value is a valid response, exactly 64 KiB included.
		for i, resp := range []string{`"text"`, `[1,2,3]`, `42`, `null`, `true`, string(bigResponse(MaxResponseBytes))} {
			a := mustAcquire(t, b, "resp-"+string(rune('a'+i)), 60)
			op := mustRecord(t, b, a, OutcomeInput{Status: StateFailed, Response: json.RawMessage(resp)})
			require.JSONEq(t, resp, string(op.Outcome.Response))
		}
	})
}

// docs/reference.md §4: the outcome works after the hold expired (evidence outlives the TTL).
func TestOutcomeAfterHoldExpired(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		succ := mustAcquire(t, b, "expired-succ", 1)
		fail := mustAcquire(t, b, "expired-fail-release", 1)
		b.elapse(t, time.Second)

		op := mustRecord(t, b, succ, OutcomeInput{Status: StateSucceeded, Receipt: ptr("late-rcpt")})
		require.Equal(t, StateSucceeded, op.State)
		require.False(t, op.Held)
		require.Equal(t, "late-rcpt", deref(op.Outcome.Receipt))
		require.Equal(t, StateSucceeded, opRow(t, b, succ.OperationID).State)

		// failed+release after expiry: released; the (expired) hold is gone, so the next acquire
		// starts clean, with no previous_operation.
		op = mustRecord(t, b, fail, OutcomeInput{Status: StateFailed, Release: true})
		require.Equal(t, StateReleased, op.State)
		require.Equal(t, StateFailed, op.Outcome.Status)
		next := mustAcquire(t, b, "expired-fail-release", 60)
		require.EqualValues(t, 2, next.FencingToken)
		require.Nil(t, next.PreviousOperation)

		next = mustAcquire(t, b, "expired-succ", 60)
		require.EqualValues(t, 2, next.FencingToken)
		require.Equal(t, StateSucceeded, next.PreviousOperation.State)
		require.Equal(t, StateSucceeded, opRow(t, b, succ.OperationID).State, "a succeeded operation never becomes uncertain")
	})
}

// docs/reference.md §4: the owner token is checked first; a wrong token is not_owner whatever else is wrong.
func TestOutcomeOwnerCheckedFirst(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acq := mustAcquire(t, b, "owner-first", 60)
		other := mustAcquire(t, b, "owner-other", 60)
		before := snapshot(t, b, acq.OperationID)
		for name, in := range map[string]OutcomeInput{
			"valid":                {OwnerToken: other.OwnerToken, Status: StateSucceeded},
			"empty token":          {OwnerToken: "", Status: StateSucceeded},
			"bad status":           {OwnerToken: "ot_nope", Status: "done"},
			"no status":            {OwnerToken: "ot_nope"},
			"release w/ succeeded": {OwnerToken: "ot_nope", Status: StateSucceeded, Release: true},
			"response too large":   {OwnerToken: "ot_nope", Status: StateSucceeded, Response: bigResponse(MaxResponseBytes + 1)},
			"invalid response":     {OwnerToken: "ot_nope", Status: StateSucceeded, Response: json.RawMessage(`{`)},
			"note too long":        {OwnerToken: "ot_nope", Status: StateFailed, Note: ptr(strings.Repeat("n", MaxNoteChars+1))},
		} {
			_, err := b.adm.RecordOutcome(bg, b.p, acq.OperationID, in)
			require.ErrorIs(t, err, ErrNotOwner, name)
		}
		require.Equal(t, before, snapshot(t, b, acq.OperationID))
	})
}

func TestOutcomeValidation(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acq := mustAcquire(t, b, "outcome-validation", 60)
		before := snapshot(t, b, acq.OperationID)
		for _, tc := range []struct {
			name  string
			in    OutcomeInput
			field string
		}{
			{"no status", OutcomeInput{}, "status"},
			{"bad status", OutcomeInput{Status: "done"}, "status"},
			{"released is not an outcome", OutcomeInput{Status: StateReleased}, "status"},
			{"in_progress is not an outcome", OutcomeInput{Status: StateInProgress}, "status"},
			{"release with succeeded", OutcomeInput{Status: StateSucceeded, Release: true}, "release"},
			{"release with uncertain", OutcomeInput{Status: StateUncertain, Release: true}, "release"},
			{"receipt too long", OutcomeInput{Status: StateSucceeded, Receipt: ptr(strings.Repeat("r", MaxReceiptChars+1))}, "receipt"},
			{"receipt with NUL", OutcomeInput{Status: StateSucceeded, Receipt: ptr("a\x00b")}, "receipt"},
			{"note too long", OutcomeInput{Status: StateFailed, Note: ptr(strings.Repeat("é", MaxNoteChars+1))}, "note"},
			{"note invalid UTF-8", OutcomeInput{Status: StateFailed, Note: ptr("\xff")}, "note"},
			{"response not JSON", OutcomeInput{Status: StateSucceeded, Response: json.RawMessage(`{"a":`)}, "response"},
			{"response two values", OutcomeInput{Status: StateSucceeded, Response: json.RawMessage(`1 2`)}, "response"},
			{"response invalid UTF-8", OutcomeInput{Status: StateSucceeded, Response: json.RawMessage("{\"a\":\"\xff\"}")}, "response"},
		} {
			in := tc.in
			in.OwnerToken = acq.OwnerToken
			_, err := b.adm.RecordOutcome(bg, b.p, acq.OperationID, in)
			require.ErrorIs(t, err, ErrInvalidRequest, tc.name)
			var de *Error
			require.ErrorAs(t, err, &de)
			require.Len(t, de.Fields, 1, tc.name)
			require.Equal(t, tc.field, de.Fields[0].Field, tc.name)
		}
		require.Equal(t, before, snapshot(t, b, acq.OperationID))

		// Limits are inclusive: exactly 512 and 1000 characters are fine.
		op := mustRecord(t, b, acq, OutcomeInput{Status: StateSucceeded, Receipt: ptr(strings.Repeat("é", MaxReceiptChars)),
			Note: ptr(strings.Repeat("n", MaxNoteChars))})
		require.Equal(t, StateSucceeded, op.State)
	})
}

// docs/reference.md §4: a response over 64 KiB is payload_too_large and nothing changes, so the operation
// is never left looking complete without its stored response.
func TestOutcomeResponseTooLarge(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acq := mustAcquire(t, b, "too-large", 60)
		before := snapshot(t, b, acq.OperationID)
		for _, resp := range []json.RawMessage{
			bigResponse(MaxResponseBytes + 1),
			json.RawMessage(`{"a":` + string(bigResponse(MaxResponseBytes)) + `}`),
		} {
			_, err := record(b, acq, OutcomeInput{Status: StateSucceeded, Receipt: ptr("r"), Response: resp})
			require.ErrorIs(t, err, ErrPayloadTooLarge)
			_, err = record(b, acq, OutcomeInput{Status: StateFailed, Response: resp, Release: true})
			require.ErrorIs(t, err, ErrPayloadTooLarge)
		}
		after := snapshot(t, b, acq.OperationID)
		require.Equal(t, before, after)
		require.Equal(t, StateInProgress, after.Op.State)
		require.Nil(t, after.Op.OutcomeStatus)
		require.Nil(t, after.Op.OutcomeResponse)
		require.Equal(t, acq.OperationID, deref(after.Key.HolderOperationID))

		// The limit is on the compacted form: whitespace does not count.
		padded := json.RawMessage(`  ` + string(bigResponse(MaxResponseBytes)) + "\n\n")
		op := mustRecord(t, b, acq, OutcomeInput{Status: StateSucceeded, Response: padded})
		require.Len(t, op.Outcome.Response, MaxResponseBytes)
	})
}

func TestOutcomeNotFound(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acq := mustAcquire(t, b, "nf", 60)
		q := otherTenant(t, b)
		before := snapshot(t, b, acq.OperationID)
		in := OutcomeInput{OwnerToken: acq.OwnerToken, Status: StateSucceeded}
		for name, id := range map[string]string{
			"unknown":     uuid.NewString(),
			"malformed":   "not-a-uuid",
			"empty":       "",
			"sql-ish":     "' OR 1=1 --",
			"upper/brace": "{" + strings.ToUpper(uuid.NewString()) + "}",
		} {
			_, err := b.adm.RecordOutcome(bg, b.p, id, in)
			require.ErrorIs(t, err, ErrNotFound, name)
			_, err = b.reads.GetOperation(bg, b.p.TenantID, id)
			require.ErrorIs(t, err, ErrNotFound, name)
		}
		_, err := b.adm.RecordOutcome(bg, q, acq.OperationID, in)
		require.ErrorIs(t, err, ErrNotFound)
		_, err = b.reads.GetOperation(bg, q.TenantID, acq.OperationID)
		require.ErrorIs(t, err, ErrNotFound)
		require.Equal(t, before, snapshot(t, b, acq.OperationID))
	})
}

// Any JSON encoding/json accepts is stored and replayed exactly as sent (compacted) on both
// dialects, including what PostgreSQL's jsonb would refuse or rewrite; only invalid UTF-8 is
// refused (400, nothing written), never an internal error on one dialect.
func TestOutcomeResponseStoredExactly(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		for name, resp := range jsonbHostileJSON {
			acq := mustAcquire(t, b, "exact-"+name, 60)
			op := mustRecord(t, b, acq, OutcomeInput{Status: StateSucceeded, Response: json.RawMessage(resp)})
			require.Equal(t, resp, string(op.Outcome.Response), name)
			d, err := b.reads.GetOperation(bg, b.p.TenantID, acq.OperationID)
			require.NoError(t, err)
			require.Equal(t, resp, string(d.Outcome.Response), name)
			_, err = record(b, acq, OutcomeInput{Status: StateSucceeded, Response: json.RawMessage(resp)})
			require.NoError(t, err, "%s: the same outcome again", name)
			meta, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "meta-" + name, TTLSeconds: 60, Metadata: json.RawMessage(`{"m":` + resp + `}`)})
			require.NoError(t, err, name)
			require.True(t, meta.Admitted)
		}
		acq := mustAcquire(t, b, "invalid-utf8", 60)
		before := snapshot(t, b, acq.OperationID)
		for _, resp := range []string{"{\"a\":\"\xff\xfe\"}", "[\"\xc0\xaf\"]"} {
			_, err := record(b, acq, OutcomeInput{Status: StateSucceeded, Response: json.RawMessage(resp)})
			require.ErrorIs(t, err, ErrInvalidRequest)
		}
		require.Equal(t, before, snapshot(t, b, acq.OperationID))
	})
}

// jsonbHostileJSON is compacted JSON that PostgreSQL's jsonb refuses or rewrites.
var jsonbHostileJSON = map[string]string{
	"lone-surrogate":  `{"a":"\ud800"}`,
	"nul":             `{"a":"x\u0000y","\u0000":1}`,
	"number-too-big":  `{"n":1e131072}`,
	"exponent":        `{"n":1e2}`,
	"member-order":    `{"b":1,"a":2}`,
	"duplicate-names": `{"a":1,"a":2}`,
}

// uuid.Parse accepts other spellings of an operation id (upper case, braces, urn:uuid:). They
// must behave the same on both dialects (PostgreSQL's uuid type accepts them, SQLite stores text).
func TestOperationIDSpellings(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		acq := mustAcquire(t, b, "id-forms", 60)
		for _, id := range []string{strings.ToUpper(acq.OperationID), "{" + acq.OperationID + "}", "urn:uuid:" + acq.OperationID} {
			d, err := b.reads.GetOperation(bg, b.p.TenantID, id)
			require.NoError(t, err, id)
			require.Equal(t, acq.OperationID, d.ID)
		}
		op, err := b.adm.RecordOutcome(bg, b.p, strings.ToUpper(acq.OperationID),
			OutcomeInput{OwnerToken: acq.OwnerToken, Status: StateSucceeded})
		require.NoError(t, err)
		require.Equal(t, acq.OperationID, op.ID)
		require.Equal(t, StateSucceeded, opRow(t, b, acq.OperationID).State)
	})
}

// A failed outcome with release after another attempt took the key over records the outcome but
// claims no release: the operation held nothing, and the new hold is untouched.
func TestOutcomeReleaseAfterTakeoverReleasesNothing(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		old := mustAcquire(t, b, "takeover-release", 1)
		b.elapse(t, time.Second)
		cur := mustAcquire(t, b, "takeover-release", 60)
		op := mustRecord(t, b, old, OutcomeInput{Status: StateFailed, Release: true})
		require.Equal(t, StateFailed, op.State)
		require.Nil(t, op.ReleasedAt)
		require.Equal(t, StateFailed, op.Outcome.Status)
		k, err := b.reads.GetKey(bg, b.p.TenantID, "takeover-release")
		require.NoError(t, err)
		require.True(t, k.Held)
		require.Equal(t, cur.OperationID, k.Operation.ID)
		// Repeating it changes nothing.
		again := mustRecord(t, b, old, OutcomeInput{Status: StateFailed, Release: true})
		require.Equal(t, StateFailed, again.State)
	})
}
