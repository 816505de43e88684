package history

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/google/uuid"
)

const testAPIKey = "idg_verify_test_key_0123456789abcdef"

// owned is an admission a client holds the owner token of. until, when set, parks it: the
// client acts as a crashed holder (no outcome, no renew, its lease lapses) until then, and
// afterwards reconciles it like an operator would.
type owned struct {
	key, op, token string
	until          time.Time
}

// recorder collects the history. Times are nanoseconds since start.
type recorder struct {
	mu    sync.Mutex
	start time.Time
	ops   []porcupine.Operation
	// answers counts answered acquires per key and result, for the attempt-log check.
	answers map[[2]string]int
	// admitted maps every 201 operation id to its key and fencing token.
	admitted map[string]owned
	fencing  map[string]int64
	statuses map[string]int
}

func newRecorder() *recorder {
	return &recorder{start: time.Now(), answers: map[[2]string]int{}, admitted: map[string]owned{},
		fencing: map[string]int64{}, statuses: map[string]int{}}
}

func (r *recorder) now() int64 { return int64(time.Since(r.start)) }

// workload is the client side: endpoints to spread calls over, keys, duration, clients.
type workload struct {
	urls     []string
	keys     []string
	clients  int
	duration time.Duration
	http     *http.Client
	// batches: about one acquire call in five is a batch of 2–4. The fault runs turn it off:
	// a batch cut off by a fault leaves every item's outcome unknown, and with hundreds of
	// cut-off calls the check's search outgrew its time bound (porcupine Unknown, no
	// violation found); batches are checked in the fault-free runs.
	batches bool
	// leases: acquires carry lease_seconds (1 to the TTL, or absent), the last key is
	// acquired with on_expiry hold_until_reconciled, and owners renew their leases
	// (docs/reference.md §8). The database-fault runs turn it off (see there).
	leases bool
	// horizons is the horizon the server's policies give each operation name (docs/reference.md
	// §2 "Lifecycle"), for the model; purges says the server's retention purges ended
	// operations during the run. Set by the runs that set such policies.
	horizons map[string]time.Duration
	purges   bool
	// ctx, when set, ends the run early when it is done (the failover run ends a few seconds
	// after its last failover, whatever duration says).
	ctx context.Context
}

// modelOptions is what the model must know of the run's server (relaxed for torn duplicates
// when torn).
func (w *workload) modelOptions(torn bool) modelOptions {
	opts := modelOptions{tornDuplicate: torn, purges: w.purges}
	if len(w.horizons) > 0 {
		opts.horizon = map[string]int64{}
		for name, d := range w.horizons {
			opts.horizon[name] = int64(d)
		}
	}
	return opts
}

func newWorkload(urls []string, prefix string, duration time.Duration) *workload {
	keys := make([]string, 4)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s:key/%d", prefix, i)
	}
	return &workload{urls: urls, keys: keys, clients: 16, duration: duration, batches: true, leases: true,
		http: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

// spreadKeys makes the workload use n keys (n ≥ the current number), named as newWorkload
// names them: fewer operations per key keep a long or faulty run within the check's bound.
func (w *workload) spreadKeys(n int) {
	prefix, _, _ := strings.Cut(w.keys[0], ":key/")
	for i := len(w.keys); i < n; i++ {
		w.keys = append(w.keys, fmt.Sprintf("%s:key/%d", prefix, i))
	}
}

// do sends one call; status 0 means no answer.
func (w *workload) do(method, url string, body any) (int, map[string]any) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Authorization", "Bearer "+testAPIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.http.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil
	}
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return resp.StatusCode, m
}

func str(m map[string]any, k string) string { s, _ := m[k].(string); return s }
func num(m map[string]any, k string) int64  { f, _ := m[k].(float64); return int64(f) }
func sub(m map[string]any, k string) map[string]any {
	s, _ := m[k].(map[string]any)
	return s
}

// relTime converts an answered time to nanoseconds since the recorder started (0 if absent).
func (r *recorder) relTime(s string) int64 {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0
	}
	return max(1, int64(t.Sub(r.start)))
}

// run drives the clients until the duration is over and returns the history.
func (w *workload) run(t *testing.T) (*recorder, []porcupine.Operation) {
	rec := newRecorder()
	parent := w.ctx
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithTimeout(parent, w.duration)
	defer cancel()
	var wg sync.WaitGroup
	for c := 0; c < w.clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			w.client(ctx, c, rec)
		}(c)
	}
	wg.Wait()
	// Unanswered calls never returned: give them a return time after the whole history.
	var end int64
	for _, op := range rec.ops {
		if op.Return > end {
			end = op.Return
		}
	}
	history := make([]porcupine.Operation, 0, len(rec.ops))
	for _, op := range rec.ops {
		if op.Output.(callOutput).Unknown {
			if op.Input.(callInput).Kind == kindGet {
				continue // a read with no answer constrains nothing
			}
			op.Return = end + 1
			out := op.Output.(callOutput)
			out.Ret = end + 1
			op.Output = out
		}
		history = append(history, op)
	}
	t.Logf("history: %d operations (%d recorded), statuses %v", len(history), len(rec.ops), rec.statuses)
	return rec, history
}

func (w *workload) client(ctx context.Context, c int, rec *recorder) {
	rng := rand.New(rand.NewSource(time.Now().UnixNano() + int64(c)*7919))
	var mine, parked []owned
	record := rec.recorderFor(c, &mine, w.leases)
	base := w.urls[c%len(w.urls)]
	for ctx.Err() == nil {
		time.Sleep(time.Duration(rng.Intn(8)) * time.Millisecond)
		if now := time.Now(); len(mine)+len(parked) > 0 {
			// Crashed holders go quiet until their time is up, then come back to reconcile.
			var kept, still []owned
			for _, o := range mine {
				if o.until.After(now) {
					still = append(still, o)
				} else {
					kept = append(kept, o)
				}
			}
			for _, o := range parked {
				if o.until.After(now) {
					still = append(still, o)
				} else {
					kept = append(kept, o)
				}
			}
			mine, parked = kept, still
		}
		in := callInput{Key: w.keys[rng.Intn(len(w.keys))]}
		var method, path string
		var body map[string]any
		var own owned
		r := rng.Intn(100)
		if len(mine) == 0 && r >= 40 && r < 85 {
			r = 0
		}
		if r >= 40 && r < 85 {
			pick := rng.Intn(min(len(mine), 4))
			if w.leases && r >= 52 && r < 67 && rng.Intn(2) == 0 {
				pick = 0 // half the renews are of the newest admission, the likeliest in progress
			}
			own = mine[len(mine)-1-pick]
			in.Key, in.Op = own.key, own.op
			token := own.token
			if rng.Intn(10) == 0 {
				in.BadToken, token = true, own.token+"x"
			}
			switch {
			case w.leases && r >= 52 && r < 67:
				in.Kind, method, path = kindRenew, http.MethodPost, "/v1/operations/"+in.Op+"/renew"
				in.Lease, in.Extend = 1+rng.Intn(2), rng.Intn(3) == 0
				body = map[string]any{"owner_token": token, "lease_seconds": in.Lease, "extend_ttl": in.Extend}
			case r < 60:
				in.Kind, method, path = kindRelease, http.MethodPost, "/v1/release"
				body = map[string]any{"key": in.Key, "owner_token": token, "reason": "verify"}
			default:
				in.Kind, method, path = kindOutcome, http.MethodPost, "/v1/operations/"+in.Op+"/outcome"
				in.Status = []string{"succeeded", "failed", "failed", "uncertain"}[rng.Intn(4)]
				in.Release = in.Status == "failed" && rng.Intn(2) == 0
				body = map[string]any{"owner_token": token, "status": in.Status, "receipt": "r-" + in.Status}
				if in.Release {
					body["release"] = true
				}
			}
		} else if r < 40 && w.batches && rng.Intn(5) == 0 {
			// A batch of 2–4 acquires, keys drawn with repetition: each item is recorded as an
			// acquire with the batch call's interval.
			items := make([]callInput, 2+rng.Intn(3))
			bodies := make([]map[string]any, len(items))
			for i := range items {
				items[i], bodies[i] = w.acquireInput(rng, w.keys[rng.Intn(len(w.keys))])
			}
			call := rec.now()
			status, resp := w.do(http.MethodPost, base+"/v1/acquire:batch", map[string]any{"items": bodies})
			ret := rec.now()
			rec.mu.Lock()
			rec.statuses[fmt.Sprintf("batch %d", status)]++
			rec.mu.Unlock()
			results, _ := resp["results"].([]any)
			if status == http.StatusOK && len(results) != len(items) {
				panic(fmt.Sprintf("batch of %d answered with %d results", len(items), len(results)))
			}
			for i := range items {
				items[i].Call = call
				itemStatus, itemResp := status, resp
				if status == http.StatusOK {
					res, _ := results[i].(map[string]any)
					itemStatus = int(num(res, "status"))
					if itemResp = sub(res, "body"); itemResp == nil {
						itemResp = sub(res, "problem")
					}
				}
				record(items[i], itemStatus, itemResp, ret)
			}
			continue
		} else if r < 40 {
			in, body = w.acquireInput(rng, in.Key)
			method, path = http.MethodPost, "/v1/acquire"
		} else {
			in.Kind, method, path = kindGet, http.MethodGet, "/v1/keys/"+url.PathEscape(in.Key)
		}
		in.Call = rec.now()
		var status int
		var resp map[string]any
		if method == http.MethodGet {
			status, resp = w.do(method, base+path, nil)
		} else {
			status, resp = w.do(method, base+path, body)
		}
		record(in, status, resp, rec.now())
	}
}

// acquireInput is a random acquire of key: its input for the model and its request body.
func (w *workload) acquireInput(rng *rand.Rand, key string) (callInput, map[string]any) {
	in := callInput{Kind: kindAcquire, Key: key, Name: "charge"}
	if rng.Intn(10) == 0 {
		in.Name = "refund"
	}
	in.FP = []string{"fp-a", "fp-b"}[rng.Intn(2)]
	in.TTL = 1 + rng.Intn(3)
	// A fresh attempt_id per call: the operation it admits records it, so an acquire whose
	// answer is lost can be looked up afterwards (resolveLostAcquires); never reused, so no
	// call is an attempt_id retry.
	in.Attempt = uuid.NewString()
	body := map[string]any{"key": in.Key, "ttl_seconds": in.TTL, "operation": in.Name, "fingerprint": in.FP,
		"attempt_id": in.Attempt}
	if w.leases {
		if rng.Intn(4) != 0 {
			in.Lease = 1 + rng.Intn(in.TTL)
			body["lease_seconds"] = in.Lease
		}
		if key == w.keys[len(w.keys)-1] {
			// Short, so that crashed holders' keys pass their TTL within a short run.
			in.Hold, in.TTL = true, 1
			body["on_expiry"], body["ttl_seconds"] = "hold_until_reconciled", 1
			if in.Lease > 0 {
				in.Lease = 1
				body["lease_seconds"] = 1
			}
		}
	}
	return in, body
}

// recordFunc records one call (or one item of a batch) answered status and resp at ret.
type recordFunc func(in callInput, status int, resp map[string]any, ret int64)

// recorderFor is the recordFunc of client c: it appends the operation to the history and
// keeps the client's owner tokens (mine) for its later releases and outcomes.
// With crashes, one admission in four, and every hold_until_reconciled one, is parked for
// 2–3 s (see owned).
func (rec *recorder) recorderFor(c int, mine *[]owned, crashes bool) recordFunc {
	rng := rand.New(rand.NewSource(time.Now().UnixNano() + int64(c)*104729))
	return func(in callInput, status int, resp map[string]any, ret int64) {
		out := callOutput{Ret: ret, Status: status, Code: str(resp, "code")}
		if status == 0 || status >= 500 {
			out = callOutput{Unknown: true, Ret: out.Ret, Status: status}
		}
		switch {
		case out.Unknown:
		case in.Kind == kindAcquire && status == 201:
			out.OpID, out.Fencing, out.Exp = str(resp, "operation_id"), num(resp, "fencing_token"), rec.relTime(str(resp, "expires_at"))
			out.LeaseExp = rec.relTime(str(resp, "lease_expires_at"))
			own := owned{key: in.Key, op: out.OpID, token: str(resp, "owner_token")}
			// Every hold_until_reconciled admission crashes, so that even a short run sees
			// the key pass its TTL uncertain (three in four still missed it once in ten
			// runs); its owner reconciles it (any outcome) when it comes back.
			if crashes && (in.Hold || rng.Intn(4) == 0) {
				own.until = time.Now().Add(2*time.Second + time.Duration(rng.Intn(1000))*time.Millisecond)
			}
			*mine = append(*mine, own)
			if len(*mine) > 8 {
				*mine = (*mine)[1:]
			}
		case in.Kind == kindAcquire && status == 200:
			op := sub(resp, "operation")
			out.OpID, out.State, out.Fencing = str(op, "id"), str(op, "state"), num(op, "fencing_token")
		case in.Kind == kindRenew && status == 200:
			out.OpID, out.Fencing = str(resp, "operation_id"), num(resp, "fencing_token")
			out.Exp, out.LeaseExp = rec.relTime(str(resp, "expires_at")), rec.relTime(str(resp, "lease_expires_at"))
		case in.Kind == kindAcquire && status == 409:
			out.OpID, out.State = str(sub(resp, "operation"), "id"), str(sub(resp, "operation"), "state")
		case in.Kind == kindOutcome && status == 200:
			out.OpID, out.State = str(resp, "id"), str(resp, "state")
		case in.Kind == kindRelease && status == 200:
			out.State = str(sub(resp, "operation"), "state")
		case in.Kind == kindGet && status == 200:
			op := sub(resp, "operation")
			out.OpID, out.State, out.Fencing, out.Held = str(op, "id"), str(op, "state"), num(op, "fencing_token"), resp["held"] == true
		}
		// Times are taken outside the lock: the lock only orders appends.
		rec.mu.Lock()
		rec.statuses[fmt.Sprintf("%s %d", in.Kind, status)]++
		if in.Kind == kindAcquire && status == 200 && sub(resp, "operation")["evidence_purged"] == true {
			rec.statuses["acquire 200 from a tombstone"]++ // counted among the 200s too
		}
		if in.Kind == kindAcquire && !out.Unknown {
			// A 409 outcome_uncertain is a duplicate attempt refused (docs/reference.md §8).
			result := map[int]string{201: "admitted", 200: "duplicate", 409: "duplicate", 422: "conflict"}[status]
			rec.answers[[2]string{in.Key, result}]++
			if status == 201 {
				rec.admitted[out.OpID] = owned{key: in.Key, op: out.OpID}
				rec.fencing[out.OpID] = out.Fencing
			}
		}
		rec.ops = append(rec.ops, porcupine.Operation{ClientId: c, Input: in, Call: in.Call, Output: out, Return: out.Ret})
		rec.mu.Unlock()
	}
}

// check runs porcupine; on failure it writes the visualization and returns its path.
func check(t *testing.T, opts modelOptions, history []porcupine.Operation, timeout time.Duration) (porcupine.CheckResult, string) {
	model := keyModel(opts)
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, history, timeout)
	t.Logf("porcupine: %s in %v over %d operations", res, time.Since(start).Round(time.Millisecond), len(history))
	if res == porcupine.Ok {
		return res, ""
	}
	explain(t, model, history, info)
	f, err := os.CreateTemp("", "idemgate-history-*.html")
	if err != nil {
		t.Logf("cannot write visualization: %v", err)
		return res, ""
	}
	defer f.Close()
	if err := porcupine.Visualize(model, info, f); err != nil {
		t.Logf("visualize: %v", err)
	}
	t.Logf("history visualization: %s", f.Name())
	return res, f.Name()
}
