package logging

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHandlerAddsTheRequestIDOfTheContext(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewHandler(slog.NewJSONHandler(&buf, nil))).With("component", "test")
	ctx := ContextWithRequestID(context.Background(), "rid-1")

	log.InfoContext(ctx, "during a request", "n", 1)
	log.Info("no context")
	log.InfoContext(context.Background(), "a context without an id")
	log.DebugContext(ctx, "below the level") // dropped by the inner handler's level

	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		recs = append(recs, rec)
	}
	require.Len(t, recs, 3)
	require.Equal(t, "rid-1", recs[0][RequestIDKey])
	require.Equal(t, "test", recs[0]["component"], "WithAttrs keeps the wrapper")
	require.NotContains(t, recs[1], RequestIDKey)
	require.NotContains(t, recs[2], RequestIDKey)
	require.Equal(t, "rid-1", RequestID(ctx))
	require.Equal(t, "", RequestID(context.Background()))
}

func TestHandlerDoesNotChangeTheCallersRecord(t *testing.T) {
	var a, b bytes.Buffer
	inner := slog.NewTextHandler(&a, nil)
	h := NewHandler(inner)
	ctx := ContextWithRequestID(context.Background(), "rid-2")
	r := slog.NewRecord(testTime, slog.LevelInfo, "m", 0)
	r.AddAttrs(slog.Int("a", 1), slog.Int("b", 2), slog.Int("c", 3), slog.Int("d", 4), slog.Int("e", 5), slog.Int("f", 6))
	require.NoError(t, h.Handle(ctx, r))
	require.NoError(t, slog.NewTextHandler(&b, nil).Handle(ctx, r))
	require.Contains(t, a.String(), "request_id=rid-2")
	require.NotContains(t, b.String(), "request_id", "the caller's record is untouched")
	require.NotContains(t, b.String(), "!BUG")
}

func TestValidRequestID(t *testing.T) {
	for _, ok := range []string{"0b6e7c1a-5d2f-4c61-9d7a-3f1e2b4c5d6e", "01J9Z8X7Y6", "req_7f3a:retry.2", "a+b/c@e~f",
		strings.Repeat("x", MaxRequestIDLen)} {
		require.True(t, ValidRequestID(ok), ok)
	}
	for _, bad := range []string{"", strings.Repeat("x", MaxRequestIDLen+1), "two words", "line\nbreak", "cr\r",
		`quo"te`, "back\\slash", "naïve", "tab\t", "pad==", "semi;colon", "<script>", "nul\x00"} {
		require.False(t, ValidRequestID(bad), "%q", bad)
	}
}

var testTime = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// FuzzValidRequestID: an accepted id is short, and a text log line carrying it keeps it
// unquoted on one line, so a client-chosen id can never forge or split a log line.
func FuzzValidRequestID(f *testing.F) {
	for _, s := range []string{"0b6e7c1a-5d2f-4c61-9d7a-3f1e2b4c5d6e", "", "line\nbreak", `a="b"`, "naïve", "x y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if !ValidRequestID(id) {
			return
		}
		require.LessOrEqual(t, len(id), MaxRequestIDLen)
		var buf bytes.Buffer
		log := slog.New(NewHandler(slog.NewTextHandler(&buf, nil)))
		log.InfoContext(ContextWithRequestID(context.Background(), id), "m")
		line := strings.TrimSuffix(buf.String(), "\n")
		require.NotContains(t, line, "\n")
		require.True(t, strings.HasSuffix(line, " "+RequestIDKey+"="+id), line)
	})
}
