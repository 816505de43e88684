package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

func TestDecodeJSONRefusesCoercion(t *testing.T) {
	for body, field := range map[string]string{
		`{"key":"a","ttl_seconds":"60"}`: "ttl_seconds",
		`{"key":"a","ttl_seconds":true}`: "ttl_seconds",
		`{"key":["a"],"ttl_seconds":1}`:  "key",
		`{"key":"a","ttl_seconds":1e99}`: "ttl_seconds",
		`{"key":"a","extra":1}`:          "extra",
		`{"KEY":"a","ttl_seconds":1}`:    "KEY",
		`{"key":"a","key":"b"}`:          "key",
	} {
		var req acquireRequest
		err := decodeJSON([]byte(body), &req)
		var de *services.Error
		require.True(t, errors.As(err, &de), body)
		require.Equal(t, services.CodeInvalidRequest, de.Code)
		require.Len(t, de.Fields, 1, body)
		require.Equal(t, field, de.Fields[0].Field, body)
	}
	for _, body := range []string{"null", "[]", `"x"`, "{\"key\":\"a\xff\"}", `{"key":"a"} {}`, `{"key":`, `{"key":"a",}`} {
		var req acquireRequest
		err := decodeJSON([]byte(body), &req)
		require.ErrorIs(t, err, services.ErrInvalidRequest, "%q", body)
	}
	var req acquireRequest
	require.NoError(t, decodeJSON([]byte(` {"key":"a","ttl_seconds":60,"metadata":{"a":[1]}} `), &req))
	require.Equal(t, "a", *req.Key)
	require.EqualValues(t, 60, *req.TTLSeconds)
	require.JSONEq(t, `{"a":[1]}`, string(req.Metadata))
}

// FuzzDecodeAcquire feeds arbitrary bodies to the acquire decoder: it never panics, every
// failure is an invalid_request domain error (so the client gets a 400, never a 500), and a
// body it accepts is valid JSON.
func FuzzDecodeAcquire(f *testing.F) {
	for _, s := range []string{`{"key":"a","ttl_seconds":60}`, `{"metadata":{"x":[1,2,{"y":null}]}}`, `[]`, `{"key":1}`,
		`{"ttl_seconds":"1"}`, `{"a":1}`, `{`, `{"key":"\u0000"}`, `{} {}`, "\xff", `{"fingerprint":null}`,
		`{"key":"a\ud800"}`, `{"key":"\ud83d\ude00"}`, `{"key":"\udfff\ud800"}`, `{"key":"\\ud800"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req acquireRequest
		err := decodeJSON(body, &req)
		if err != nil {
			var de *services.Error
			if !errors.As(err, &de) || de.Code != services.CodeInvalidRequest {
				t.Fatalf("decode error is not invalid_request: %v", err)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		// No accepted string member was silently altered: U+FFFD only where the client wrote it.
		if req.Key != nil && strings.Contains(*req.Key, "\uFFFD") && !bytes.Contains(body, []byte("\uFFFD")) &&
			!bytes.Contains(bytes.ToLower(body), []byte(`\ufffd`)) {
			t.Fatalf("key %q has U+FFFD the body %q did not send", *req.Key, body)
		}
	})
}

func TestDecodeJSONRefusesLoneSurrogates(t *testing.T) {
	for body, ok := range map[string]bool{
		`{"key":"sur\ud800x"}`:        false,
		`{"key":"sur\udfffx"}`:        false,
		`{"key":"\uDBFF"}`:            false,
		`{"key":"\ud800\u0041"}`:      false,
		`{"key":"\udc00\ud800"}`:      false,
		`{"key":"sur\ufffdx"}`:        true, // U+FFFD itself is a character like any other
		`{"key":"\ud83d\ude00"}`:      true, // a pair: 😀
		`{"key":"\\ud800"}`:           true, // an escaped backslash, then text
		`{"metadata":{"k":"\ud800"}}`: true, // nested values are stored as sent
	} {
		var req acquireRequest
		err := decodeJSON([]byte(body), &req)
		if ok {
			require.NoError(t, err, body)
			continue
		}
		require.ErrorIs(t, err, services.ErrInvalidRequest, body)
		var de *services.Error
		require.ErrorAs(t, err, &de)
		require.Equal(t, "key", de.Fields[0].Field, body)
	}
}
