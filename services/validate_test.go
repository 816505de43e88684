package services

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestValidateKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		key   string
		valid bool
	}{
		{"empty", "", false},
		{"one byte", "a", true},
		{"255 bytes", strings.Repeat("k", 255), true},
		{"256 bytes", strings.Repeat("k", 256), false},
		{"254 bytes + 2-byte rune = 256", strings.Repeat("k", 254) + "é", false},
		{"253 bytes + 2-byte rune = 255", strings.Repeat("k", 253) + "é", true},
		{"252 bytes + 4-byte rune = 256", strings.Repeat("k", 252) + "🔑", false},
		{"251 bytes + 4-byte rune = 255", strings.Repeat("k", 251) + "🔑", true},
		{"85 three-byte runes = 255", strings.Repeat("€", 85), true},
		{"85 three-byte runes + 1 = 256", strings.Repeat("€", 85) + "a", false},
		{"invalid UTF-8", "ab\xffcd", false},
		{"truncated rune", "key\xe2\x82", false},
		{"overlong encoding", "\xc0\xaf", false},
		{"UTF-16 surrogate as UTF-8", "\xed\xa0\x80", false},
		{"NUL", "a\x00b", false},
		{"tab", "a\tb", false},
		{"newline", "a\nb", false},
		{"DEL", "a\x7fb", false},
		{"C1 NEL", "a\u0085b", false},
		{"C1 CSI", "a\u009bb", false},
		{"escape", "\x1b[31m", false},
		{"space", " ", false},
		{"spaces", "   ", false},
		{"NBSP only", "\u00a0", false},
		{"ideographic space only", "\u3000\u2003", false},
		{"leading and trailing spaces", " a ", true},
		{"slash", "a/b", true},
		{"percent-encoded slash", "x%2Fy", true},
		{"inner space", "sp ace", true},
		{"colon and query chars", "order:42?x=1&y=#", true},
		{"Cyrillic", "ключ", true},
		{"emoji", "🔑", true},
		{"emoji ZWJ sequence", "👩‍💻", true},
		{"NFD accent", "e\u0301", true},
		{"RTL text", "مفتاح", true},
		{"line separator", "a\u2028b", true}, // a separator, not a control character
	} {
		msg := ValidateKey(tc.key)
		if tc.valid {
			require.Empty(t, msg, tc.name)
		} else {
			require.NotEmpty(t, msg, tc.name)
		}
	}
}

func TestValidateOperationName(t *testing.T) {
	t.Parallel()
	for name, valid := range map[string]bool{
		"":                         false,
		"issue-invoice":            true,
		"a":                        true,
		"billing.v2:charge_card-1": true,
		strings.Repeat("o", 64):    true,
		strings.Repeat("o", 65):    false,
		"has space":                false,
		"slash/op":                 false,
		"é":                        false,
		"op\x00":                   false,
		"op\n":                     false,
		"😀":                        false,
		"UPPER_lower.09":           true,
	} {
		require.Equal(t, valid, ValidateOperationName(name) == "", "%q", name)
	}
}

// fieldsOf returns the names of the invalid fields in a validation error.
func fieldsOf(t *testing.T, err error) []string {
	t.Helper()
	require.ErrorIs(t, err, ErrInvalidRequest)
	var de *Error
	require.ErrorAs(t, err, &de)
	var out []string
	for _, f := range de.Fields {
		require.NotEmpty(t, f.Message, f.Field)
		out = append(out, f.Field)
	}
	return out
}

// metadataOfSize returns a JSON object whose compacted serialization is exactly n bytes.
func metadataOfSize(n int) json.RawMessage {
	return json.RawMessage(`{"a":"` + strings.Repeat("m", n-8) + `"}`)
}

// Every limit of docs/reference.md §4 is enforced, and a refused acquire writes nothing (issue 2 point 5).
func TestAcquireValidation(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		maxSecs := int64(b.adm.maxTTL / time.Second)
		require.EqualValues(t, 30*24*3600, maxSecs)
		before := countRows(t, b)
		refused := []struct {
			name  string
			in    AcquireInput
			field string
		}{
			{"ttl 0", AcquireInput{Key: "v", TTLSeconds: 0}, "ttl_seconds"},
			{"ttl negative", AcquireInput{Key: "v", TTLSeconds: -5}, "ttl_seconds"},
			{"ttl max+1", AcquireInput{Key: "v", TTLSeconds: maxSecs + 1}, "ttl_seconds"},
			{"ttl huge", AcquireInput{Key: "v", TTLSeconds: 1 << 62}, "ttl_seconds"},
			{"empty key", AcquireInput{Key: "", TTLSeconds: 60}, "key"},
			{"key 256 bytes", AcquireInput{Key: strings.Repeat("k", 256), TTLSeconds: 60}, "key"},
			{"key with NUL", AcquireInput{Key: "a\x00", TTLSeconds: 60}, "key"},
			{"key all whitespace", AcquireInput{Key: " \t", TTLSeconds: 60}, "key"},
			{"key invalid UTF-8", AcquireInput{Key: "\xff", TTLSeconds: 60}, "key"},
			{"metadata array", AcquireInput{Key: "v", TTLSeconds: 60, Metadata: json.RawMessage(`[1,2]`)}, "metadata"},
			{"metadata string", AcquireInput{Key: "v", TTLSeconds: 60, Metadata: json.RawMessage(`"x"`)}, "metadata"},
			{"metadata number", AcquireInput{Key: "v", TTLSeconds: 60, Metadata: json.RawMessage(`42`)}, "metadata"},
			{"metadata invalid JSON", AcquireInput{Key: "v", TTLSeconds: 60, Metadata: json.RawMessage(`{"a":}`)}, "metadata"},
			{"metadata empty", AcquireInput{Key: "v", TTLSeconds: 60, Metadata: json.RawMessage(``)}, "metadata"},
			{"metadata 16 KiB + 1", AcquireInput{Key: "v", TTLSeconds: 60, Metadata: metadataOfSize(MaxMetadataBytes + 1)}, "metadata"},
			{"metadata invalid UTF-8", AcquireInput{Key: "v", TTLSeconds: 60, Metadata: json.RawMessage("{\"a\":\"\xff\"}")}, "metadata"},
			{"fingerprint 257", AcquireInput{Key: "v", TTLSeconds: 60, Fingerprint: ptr(strings.Repeat("f", 257))}, "fingerprint"},
			{"fingerprint empty", AcquireInput{Key: "v", TTLSeconds: 60, Fingerprint: ptr("")}, "fingerprint"},
			{"fingerprint NUL", AcquireInput{Key: "v", TTLSeconds: 60, Fingerprint: ptr("a\x00")}, "fingerprint"},
			{"correlation_id 129", AcquireInput{Key: "v", TTLSeconds: 60, CorrelationID: ptr(strings.Repeat("c", 129))}, "correlation_id"},
			{"attempt_id 129", AcquireInput{Key: "v", TTLSeconds: 60, AttemptID: ptr(strings.Repeat("a", 129))}, "attempt_id"},
			{"attempt_id invalid UTF-8", AcquireInput{Key: "v", TTLSeconds: 60, AttemptID: ptr("\xc3")}, "attempt_id"},
			{"operation name", AcquireInput{Key: "v", TTLSeconds: 60, Operation: ptr("issue invoice")}, "operation"},
			{"operation 65", AcquireInput{Key: "v", TTLSeconds: 60, Operation: ptr(strings.Repeat("o", 65))}, "operation"},
		}
		for _, tc := range refused {
			_, err := b.adm.Acquire(bg, b.p, tc.in)
			require.Equal(t, []string{tc.field}, fieldsOf(t, err), tc.name)
		}
		// All problems are reported at once.
		_, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "", TTLSeconds: 0, Operation: ptr("bad op"),
			Fingerprint: ptr(""), CorrelationID: ptr(""), AttemptID: ptr(""), Metadata: json.RawMessage(`[]`)})
		require.ElementsMatch(t, []string{"key", "ttl_seconds", "operation", "fingerprint", "correlation_id", "attempt_id", "metadata"},
			fieldsOf(t, err))
		require.Equal(t, before, countRows(t, b), "a refused acquire wrote something")

		// The limits themselves are accepted.
		acq, err := b.adm.Acquire(bg, b.p, AcquireInput{Key: "max-ttl", TTLSeconds: maxSecs})
		require.NoError(t, err)
		require.True(t, acq.Admitted)
		require.WithinDuration(t, time.Now().Add(30*24*time.Hour), acq.ExpiresAt, time.Minute)
		acq, err = b.adm.Acquire(bg, b.p, AcquireInput{Key: "min-ttl", TTLSeconds: 1})
		require.NoError(t, err)
		require.True(t, acq.Admitted)

		meta := metadataOfSize(MaxMetadataBytes)
		acq, err = b.adm.Acquire(bg, b.p, AcquireInput{Key: "meta-max", TTLSeconds: 60, Metadata: meta,
			Fingerprint: ptr(strings.Repeat("f", 256)), CorrelationID: ptr(strings.Repeat("c", 128)),
			AttemptID: ptr(strings.Repeat("a", 128)), Operation: ptr(strings.Repeat("o", 64))})
		require.NoError(t, err)
		require.True(t, acq.Admitted)
		d, err := b.reads.GetOperation(bg, b.p.TenantID, acq.OperationID)
		require.NoError(t, err)
		require.JSONEq(t, string(meta), string(d.Metadata))
		require.Equal(t, strings.Repeat("f", 256), deref(d.Fingerprint))

		// The metadata limit is on the compacted form; whitespace does not count. null is absent.
		padded := json.RawMessage("{\n  \"a\" : \"" + strings.Repeat("m", MaxMetadataBytes-8) + "\"\n}\n")
		acq, err = b.adm.Acquire(bg, b.p, AcquireInput{Key: "meta-padded", TTLSeconds: 60, Metadata: padded})
		require.NoError(t, err)
		require.True(t, acq.Admitted)
		acq, err = b.adm.Acquire(bg, b.p, AcquireInput{Key: "meta-null", TTLSeconds: 60, Metadata: json.RawMessage(`null`)})
		require.NoError(t, err)
		d, err = b.reads.GetOperation(bg, b.p.TenantID, acq.OperationID)
		require.NoError(t, err)
		require.Nil(t, d.Metadata)
		// Storable extremes are stored on both dialects.
		acq, err = b.adm.Acquire(bg, b.p, AcquireInput{Key: "meta-extremes", TTLSeconds: 60,
			Metadata: json.RawMessage(`{"big":1e131071,"tiny":-1e-16383,"pair":"\ud83d\ude00","name\u00e9":"\u2028"}`)})
		require.NoError(t, err)
		require.True(t, acq.Admitted)
	})
}

// Keys are opaque and byte-exact (docs/reference.md §2): no case folding, no Unicode normalisation, and
// characters that matter in URLs round-trip.
func TestKeysAreByteExact(t *testing.T) {
	t.Parallel()
	keys := []string{"a/b", "x%2Fy", "sp ace", "ключ", "🔑", "Key", "key", "KEY", "\u00e9", "e\u0301", "key ", " key",
		strings.Repeat("ж", 127) + "k", "a:b", `quote"back\slash`, "%", "100%"}
	eachDB(t, func(t *testing.T, b *testBundle) {
		ids := map[string]bool{}
		for _, k := range keys {
			acq := mustAcquire(t, b, k, 60)
			require.EqualValues(t, 1, acq.FencingToken, "%q is a key of its own", k)
			require.Equal(t, k, acq.Key)
			ids[acq.OperationID] = true
		}
		require.Len(t, ids, len(keys))
		for _, k := range keys {
			v, err := b.reads.GetKey(bg, b.p.TenantID, k)
			require.NoError(t, err, "%q", k)
			require.Equal(t, k, v.Key)
			require.Equal(t, k, v.Operation.Key)
			require.True(t, v.Held)
			atts, err := b.reads.ListAttempts(bg, b.p.TenantID, AttemptFilter{Key: k})
			require.NoError(t, err)
			require.Len(t, atts.Items, 1, "%q", k)
			require.Equal(t, k, atts.Items[0].Key)
		}
		for _, k := range []string{"KeY", "e", "\u00c9", "a%2Fb", "sp%20ace"} {
			_, err := b.reads.GetKey(bg, b.p.TenantID, k)
			require.ErrorIs(t, err, ErrNotFound, "%q", k)
		}
		_, err := b.reads.GetKey(bg, b.p.TenantID, "bad\x00key")
		require.ErrorIs(t, err, ErrNotFound)
		page, err := b.reads.ListKeys(bg, b.p.TenantID, KeyFilter{Limit: MaxListLimit})
		require.NoError(t, err)
		require.Len(t, page.Items, len(keys))
		require.Equal(t, StateInProgress, page.Items[0].Operation.State)
	})
}

// canonicalJSON decides "the same response again" (docs/reference.md §4): equal JSON values compare
// equal whatever their spelling, as PostgreSQL's jsonb hands them back normalised.
func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	same := [][]string{
		{`100`, `1e2`, `1E+2`, `100.0`, `1.00e2`, `0.1e3`, `10000e-2`},
		{`0`, `-0`, `0.0`, `0e10`, `-0.0e-5`},
		{`-1.5`, `-1.50`, `-15e-1`, `-0.15E1`},
		{`{"a":1,"b":[true,null,"x"]}`, "{ \"b\" : [ true , null , \"\\u0078\" ] ,\n \"a\" : 1.0 }"},
		{`"é"`, `"\u00e9"`, `"\u00E9"`},
		{`12345678901234567890123`, `1.2345678901234567890123e22`},
	}
	for _, group := range same {
		for _, s := range group[1:] {
			require.Equal(t, canonicalJSON([]byte(group[0])), canonicalJSON([]byte(s)), "%s vs %s", group[0], s)
		}
	}
	for _, pair := range [][2]string{
		{`1.5`, `1.05`}, {`1`, `-1`}, {`10`, `1`}, {`[1,2]`, `[2,1]`}, {`{"a":1}`, `{"a":"1"}`},
		{`12345678901234567890`, `12345678901234567891`}, {`1e-7`, `0`}, {`"e\u0301"`, `"é"`}, {`null`, `{}`},
	} {
		require.NotEqual(t, canonicalJSON([]byte(pair[0])), canonicalJSON([]byte(pair[1])), "%s vs %s", pair[0], pair[1])
	}
	require.Equal(t, "", canonicalJSON(nil))
}

// TestAcquireTTLCeiling: however large the configured maximum, ttl_seconds above MaxTTLSeconds
// (2^31-1, what PostgreSQL's integer parameter of the acquire function holds) is refused with
// 400 before any store call, the same answer on both dialects; the ceiling itself is admitted
// on both (issue 9 item 7: PostgreSQL answered 500 and SQLite 201 for 2^31).
func TestAcquireTTLCeiling(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		adm := NewAdmission(b.db, slog.New(slog.DiscardHandler), 100*365*24*time.Hour)
		require.Equal(t, MaxTTL, adm.maxTTL, "a larger maximum is cut to what both stores hold")
		before := countRows(t, b)
		for _, ttl := range []int64{MaxTTLSeconds + 1, 1 << 32, 1<<63 - 1} {
			_, err := adm.Acquire(bg, b.p, AcquireInput{Key: "ttl-ceiling", TTLSeconds: ttl})
			require.Equal(t, []string{"ttl_seconds"}, fieldsOf(t, err), "ttl %d", ttl)
		}
		require.Equal(t, before, countRows(t, b), "a refused acquire wrote something")
		acq, err := adm.Acquire(bg, b.p, AcquireInput{Key: "ttl-ceiling", TTLSeconds: MaxTTLSeconds})
		require.NoError(t, err)
		require.True(t, acq.Admitted)
		require.WithinDuration(t, time.Now().Add(MaxTTLSeconds*time.Second), acq.ExpiresAt, time.Minute)
	})
}
