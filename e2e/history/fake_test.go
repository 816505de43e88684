package history

// The checker must catch real bugs: the same workload and model against an in-memory fake of
// the API, once correct and once with a check-then-insert acquire (the classic race: the
// check and the insert are separate critical sections, so concurrent acquires of a free key
// are all admitted).

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"
)

type fakeOp struct {
	id, key, name, fp, token, state, outcome string
	fencing                                  int64
	exp                                      time.Time
}

type fakeKey struct {
	fencing int64
	holder  string
	exp     time.Time
	last    string
}

// Fake server bugs.
const (
	fakeCorrect        = ""
	fakeCheckThenPut   = "check-then-insert acquire"
	fakeNoOwnerRelease = "release without the owner compare"
)

type fakeServer struct {
	mu     sync.Mutex
	broken string
	keys   map[string]*fakeKey
	ops    map[string]*fakeOp
}

func newFakeServer(broken string) *fakeServer {
	return &fakeServer{broken: broken, keys: map[string]*fakeKey{}, ops: map[string]*fakeOp{}}
}

func randID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func reply(w http.ResponseWriter, status int, body map[string]any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func problem(w http.ResponseWriter, status int, code string) {
	reply(w, status, map[string]any{"status": status, "code": code})
}

func (f *fakeServer) opJSON(o *fakeOp) map[string]any {
	return map[string]any{"id": o.id, "key": o.key, "state": o.state, "fencing_token": o.fencing}
}

// live reports whether k is held now; caller holds f.mu.
func (f *fakeServer) live(k *fakeKey, now time.Time) bool {
	return k != nil && k.holder != "" && now.Before(k.exp)
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/acquire:batch" {
		f.acquireBatch(w, r)
		return
	}
	var req struct {
		Key        string `json:"key"`
		TTL        int    `json:"ttl_seconds"`
		Operation  string `json:"operation"`
		FP         string `json:"fingerprint"`
		OwnerToken string `json:"owner_token"`
		Status     string `json:"status"`
		Release    bool   `json:"release"`
	}
	if r.Method == http.MethodPost {
		_ = json.NewDecoder(r.Body).Decode(&req)
	}
	switch {
	case r.URL.Path == "/v1/acquire":
		f.acquire(w, req.Key, req.Operation, req.FP, req.TTL)
	case r.URL.Path == "/v1/release":
		f.release(w, req.Key, req.OwnerToken)
	case strings.HasPrefix(r.URL.Path, "/v1/operations/"):
		id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/operations/"), "/outcome")
		f.outcome(w, id, req.OwnerToken, req.Status, req.Release)
	case strings.HasPrefix(r.URL.Path, "/v1/keys/"):
		f.get(w, strings.TrimPrefix(r.URL.Path, "/v1/keys/"))
	default:
		problem(w, 404, "not_found")
	}
}

func (f *fakeServer) acquire(w http.ResponseWriter, key, name, fp string, ttl int) {
	f.mu.Lock()
	now := time.Now()
	k := f.keys[key]
	if f.live(k, now) {
		h := f.ops[k.holder]
		defer f.mu.Unlock()
		if h.name == name && h.fp == fp {
			reply(w, 200, map[string]any{"admitted": false, "key": key, "operation": f.opJSON(h)})
		} else {
			problem(w, 422, "fingerprint_mismatch")
		}
		return
	}
	var fencing int64
	if k != nil {
		fencing = k.fencing
	}
	if f.broken == fakeCheckThenPut {
		// The bug: the key was checked free in one critical section and is taken in another.
		f.mu.Unlock()
		time.Sleep(3 * time.Millisecond)
		f.mu.Lock()
	}
	defer f.mu.Unlock()
	now = time.Now()
	if k = f.keys[key]; k == nil {
		k = &fakeKey{}
		f.keys[key] = k
	}
	if k.holder != "" {
		if h := f.ops[k.holder]; h.state == "in_progress" {
			h.state = "uncertain"
		}
	}
	o := &fakeOp{id: randID(), key: key, name: name, fp: fp, token: randID(), state: "in_progress",
		fencing: fencing + 1, exp: now.Add(time.Duration(ttl) * time.Second)}
	f.ops[o.id] = o
	k.fencing, k.holder, k.exp, k.last = o.fencing, o.id, o.exp, o.id
	reply(w, 201, map[string]any{"admitted": true, "key": key, "operation_id": o.id, "owner_token": o.token,
		"fencing_token": o.fencing, "state": o.state, "expires_at": o.exp.UTC().Format(time.RFC3339Nano)})
}

// acquireBatch answers each item as acquire would, in order, each result with its status and
// its body (or problem).
func (f *fakeServer) acquireBatch(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Items []struct {
			Key       string `json:"key"`
			TTL       int    `json:"ttl_seconds"`
			Operation string `json:"operation"`
			FP        string `json:"fingerprint"`
		} `json:"items"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	results := make([]any, 0, len(req.Items))
	for _, it := range req.Items {
		rec := httptest.NewRecorder()
		f.acquire(rec, it.Key, it.Operation, it.FP, it.TTL)
		var body map[string]any
		_ = json.Unmarshal(rec.Body.Bytes(), &body)
		member := "body"
		if rec.Code >= 400 {
			member = "problem"
		}
		results = append(results, map[string]any{"status": rec.Code, member: body})
	}
	reply(w, 200, map[string]any{"results": results})
}

func (f *fakeServer) release(w http.ResponseWriter, key, token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.keys[key]
	if !f.live(k, time.Now()) {
		problem(w, 404, "key_not_held")
		return
	}
	h := f.ops[k.holder]
	switch {
	case h.token != token && f.broken != fakeNoOwnerRelease:
		problem(w, 409, "not_owner")
	case h.state == "succeeded":
		problem(w, 409, "effect_confirmed")
	case h.state == "uncertain":
		problem(w, 409, "outcome_uncertain")
	default:
		h.state, k.holder = "released", ""
		reply(w, 200, map[string]any{"released": true, "operation": f.opJSON(h)})
	}
}

func (f *fakeServer) outcome(w http.ResponseWriter, id, token, status string, release bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o := f.ops[id]
	switch {
	case o == nil:
		problem(w, 404, "not_found")
		return
	case o.token != token:
		problem(w, 403, "not_owner")
		return
	case status == o.outcome:
	case o.state == "in_progress" || (o.state == "uncertain" && status != "uncertain"):
		o.state, o.outcome = status, status
		if k := f.keys[o.key]; release && k.holder == id && f.live(k, time.Now()) {
			o.state, k.holder = "released", ""
		}
	default:
		problem(w, 409, "invalid_transition")
		return
	}
	reply(w, 200, f.opJSON(o))
}

func (f *fakeServer) get(w http.ResponseWriter, key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.keys[key]
	if k == nil {
		problem(w, 404, "not_found")
		return
	}
	reply(w, 200, map[string]any{"key": key, "held": f.live(k, time.Now()), "operation": f.opJSON(f.ops[k.last])})
}

func runFake(t *testing.T, broken string) porcupine.CheckResult {
	srv := httptest.NewServer(newFakeServer(broken))
	defer srv.Close()
	w := newWorkload([]string{srv.URL}, "fake", 3*time.Second)
	_, history := w.run(t)
	res, _ := check(t, modelOptions{}, history, 30*time.Second)
	return res
}

// TestModelAcceptsCorrectFake: the model is not merely rejecting everything.
func TestModelAcceptsCorrectFake(t *testing.T) {
	require.Equal(t, porcupine.Ok, runFake(t, fakeCorrect))
}

// TestCheckerCatchesCheckThenInsert: the broken acquire admits two attempts for one free key
// (same fencing token), and the checker must say so.
func TestCheckerCatchesCheckThenInsert(t *testing.T) {
	require.Equal(t, porcupine.Illegal, runFake(t, fakeCheckThenPut), "the race went unnoticed")
}

// TestCheckerCatchesReleaseWithoutOwnerCheck: a release that does not compare the owner token
// lets a wrong token (or a former holder) remove another attempt's hold.
func TestCheckerCatchesReleaseWithoutOwnerCheck(t *testing.T) {
	require.Equal(t, porcupine.Illegal, runFake(t, fakeNoOwnerRelease), "the foreign release went unnoticed")
}
