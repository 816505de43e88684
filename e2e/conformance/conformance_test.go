package conformance_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate/e2e/conformance"
	"github.com/stretchr/testify/require"
)

// naiveOrders is the service README.md describes with no idempotency at all: every request
// runs, keys are ignored.
func naiveOrders() http.Handler {
	var started atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /orders/started", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(started.Load())
	})
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		started.Add(1)
		if ms, _ := strconv.Atoi(r.URL.Query().Get("delay_ms")); ms > 0 {
			select { // the execution's own duration, cut short if the client leaves
			case <-time.After(time.Duration(ms) * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
		status := http.StatusCreated
		if s, err := strconv.Atoi(r.URL.Query().Get("status")); err == nil {
			status = s
		}
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]string{"id": hex.EncodeToString(b)})
	})
	return mux
}

// TestSuiteCatchesNaiveService: the suite is not a check that cannot fail. Against a service
// that ignores Idempotency-Key, every case that needs the key honoured fails; the only ones
// that pass are those a plain service meets by itself (its first request is processed).
func TestSuiteCatchesNaiveService(t *testing.T) {
	srv := httptest.NewServer(naiveOrders())
	t.Cleanup(srv.Close)
	cases, err := conformance.Cases()
	require.NoError(t, err)
	results := conformance.Run(context.Background(), srv.URL, srv.Client(), cases)
	t.Logf("report:\n%s", conformance.Report(results))
	passed := map[string]bool{}
	for _, r := range results {
		passed[r.Case.ID] = r.Pass
	}
	require.Equal(t, map[string]bool{
		"key-is-sf-string": false, "reuse-other-payload-fails": false, "missing-key-uncorrected-fails": false,
		"first-request-processed": true, "retry-gets-completed-result": false, "retry-gets-completed-error": false,
		"concurrent-retry-409": false, "missing-key-400": false, "reuse-other-payload-422": false,
		"errors-are-problem-documents": false, "replay-is-marked": false, "bare-token-key-accepted": false,
		"server-error-replayed": false,
	}, passed)
}

// TestReadmeListsEveryCase: README.md lists every case of cases.json with its level and the
// sentence it checks, so the published list and the data never drift apart.
func TestReadmeListsEveryCase(t *testing.T) {
	raw, err := os.ReadFile("README.md")
	require.NoError(t, err)
	readme := string(raw)
	cases, err := conformance.Cases()
	require.NoError(t, err)
	require.NotEmpty(t, cases)
	for _, c := range cases {
		require.Contains(t, readme, "`"+c.ID+"`", "README.md does not list %s", c.ID)
		// The sentence, as quoted in the README (its first 60 characters suffice to find it).
		require.Contains(t, readme, c.Sentence[:min(60, len(c.Sentence))], "README.md does not quote %s's sentence", c.ID)
		require.True(t, strings.Contains(readme, "`"+c.ID+"` | "+c.Level), "README.md gives %s another level", c.ID)
	}
}
