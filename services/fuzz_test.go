package services

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// Run one with e.g. `go test -run=^$ -fuzz=FuzzValidateKey -fuzztime=10s ./services/`; plain
// `go test` runs the seeds.

func FuzzValidateKey(f *testing.F) {
	for _, s := range []string{"", "a", "order-1", "a/b", "sp ace", "ключ", "🔑", " ", "\u00a0", "a\x00b", "\x7f",
		"\u0085", "\xff", "\xc0\xaf", "\xed\xa0\x80", strings.Repeat("k", 255), strings.Repeat("k", 256),
		strings.Repeat("k", 254) + "é", "e\u0301", "\u2028", "\t\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		msg := ValidateKey(key)
		noControl := strings.IndexFunc(key, unicode.IsControl) < 0
		notBlank := strings.TrimFunc(key, unicode.IsSpace) != ""
		want := len(key) >= 1 && len(key) <= MaxKeyBytes && utf8.ValidString(key) && noControl && notBlank
		if want {
			require.Empty(t, msg, "%q", key)
		} else {
			require.NotEmpty(t, msg, "%q", key)
		}
		if msg == "" {
			// A valid key is storable as text in both databases.
			require.NotContains(t, key, "\x00")
			for _, r := range key {
				require.NotEqual(t, utf8.RuneError, r, "%q", key)
				require.False(t, unicode.IsControl(r), "%q", key)
			}
		}
	})
}

func FuzzValidateJSON(f *testing.F) {
	for _, s := range []string{`{}`, `[]`, `null`, `{"a":1}`, ` { "b" : [1, 2.50, -0, 1e2, "x"] } `, `"\u0000"`,
		`{"\u0000":1}`, `"\\u0000"`, `"\ud800"`, `"\ud83d\ude00"`, `"\udc00\ud800"`, "\"\xff\"", `1e131072`,
		`1e-16384`, `0e99999`, `-0.0e-5`, `{"a":{"a":{"a":[[[]]]}}}`, `{`, `1 2`, ``, `{"a":1,"a":2}`,
		`"<&>\u2028"`, `12345678901234567890123456789`} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, raw []byte, wantObject bool) {
		out, msg := validateJSON(raw, wantObject)
		if msg != "" {
			require.Nil(t, out)
			return
		}
		require.True(t, json.Valid(raw), "accepted invalid JSON %q", raw)
		require.True(t, json.Valid(out), "output %q is not JSON", out)
		require.True(t, utf8.Valid(out))
		require.NotContains(t, string(out), "\n")
		if wantObject {
			require.Equal(t, byte('{'), out[0])
		}
		// Compacting is idempotent, so the stored form validates to itself.
		again, msg := validateJSON(out, wantObject)
		require.Empty(t, msg)
		require.Equal(t, string(out), string(again))
		// canonicalJSON is JSON and a fixed point.
		c := canonicalJSON(out)
		require.True(t, json.Valid([]byte(c)), "canonical form %q is not JSON", c)
		require.Equal(t, c, canonicalJSON([]byte(c)))
		require.Equal(t, c, canonicalJSON(raw), "canonical form depends on whitespace")
	})
}

func FuzzAcquireInputValidate(f *testing.F) {
	f.Add("order-1", int64(60), []byte(`{"a":1}`), true, "charge", "fp", "corr")
	f.Add("", int64(0), []byte(`[1]`), true, "bad op", "", "")
	f.Add("k", int64(2592000), []byte(`null`), true, "", "", "")
	f.Add("k", int64(2592001), []byte(``), true, "", "", "")
	f.Add("\x00", int64(-1), []byte(`{"x":"\u0000"}`), true, "op", "f", "c")
	f.Add("ключ", int64(1), []byte(`{"n":1e999999}`), true, "a.b:c-d_e", strings.Repeat("f", 257), "")
	f.Add("k", int64(1)<<62, []byte(nil), false, "", "", "")
	f.Fuzz(func(t *testing.T, key string, ttl int64, meta []byte, useMeta bool, op, fp, corr string) {
		in := AcquireInput{Key: key, TTLSeconds: ttl}
		if useMeta {
			in.Metadata = meta
		}
		if op != "" {
			in.Operation = &op
		}
		if fp != "" {
			in.Fingerprint = &fp
		}
		if corr != "" {
			in.CorrelationID = &corr
		}
		out, err := in.validate(DefaultMaxTTL)
		bad := map[string]bool{}
		if err != nil {
			var de *Error
			require.ErrorAs(t, err, &de)
			require.Equal(t, CodeInvalidRequest, de.Code)
			require.NotEmpty(t, de.Fields)
			for _, fe := range de.Fields {
				require.Contains(t, []string{"key", "ttl_seconds", "operation", "fingerprint", "correlation_id", "metadata"}, fe.Field)
				require.False(t, bad[fe.Field], "field %s reported twice", fe.Field)
				require.NotEmpty(t, fe.Message)
				bad[fe.Field] = true
			}
			require.Nil(t, out)
		}
		// Each field is reported exactly when it is wrong.
		require.Equal(t, ValidateKey(key) != "", bad["key"], "key %q", key)
		require.Equal(t, ttl < 1 || ttl > int64(DefaultMaxTTL.Seconds()), bad["ttl_seconds"], "ttl %d", ttl)
		require.Equal(t, op != "" && ValidateOperationName(op) != "", bad["operation"], "operation %q", op)
		fpBad := fp != "" && (!utf8.ValidString(fp) || strings.ContainsRune(fp, 0) || utf8.RuneCountInString(fp) > MaxFingerprintChars)
		require.Equal(t, fpBad, bad["fingerprint"], "fingerprint %q", fp)
		corrBad := corr != "" && (!utf8.ValidString(corr) || strings.ContainsRune(corr, 0) || utf8.RuneCountInString(corr) > MaxCorrelationIDChars)
		require.Equal(t, corrBad, bad["correlation_id"], "correlation_id %q", corr)
		absent := in.Metadata == nil || string(in.Metadata) == "null"
		if absent {
			require.False(t, bad["metadata"])
		}
		if err == nil {
			if absent {
				require.Nil(t, out)
			} else {
				require.True(t, json.Valid(out))
				require.Equal(t, byte('{'), out[0])
				require.LessOrEqual(t, len(out), MaxMetadataBytes)
			}
		}
	})
}

// FuzzQueueCursor: decoding never panics, accepts only what encoding makes, and round-trips.
func FuzzQueueCursor(f *testing.F) {
	for _, s := range []string{"", "x", "MTIzLjQ1Ng", encodeQueueCursor(time.Unix(0, 1764560000123456000), "0b4e7a52-5c1f-4d8e-9a0b-3f2c1d4e5f60"),
		"MTIzLjBiNGU3YTUyLTVjMWYtNGQ4ZS05YTBiLTNmMmMxZDRlNWY2MA==", "LTEuMGI0ZTdhNTItNWMxZi00ZDhlLTlhMGItM2YyYzFkNGU1ZjYw"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, c string) {
		at, id, err := decodeQueueCursor(c)
		if err != nil || c == "" {
			return
		}
		require.Len(t, id, 36)
		again := encodeQueueCursor(at, id)
		at2, id2, err := decodeQueueCursor(again)
		require.NoError(t, err)
		require.True(t, at.Equal(at2))
		require.Equal(t, id, id2)
	})
}
