// Command scale is the client of make scale (.ci/scale.sh, issue 27): it seeds an idemgate
// through the public API only, times dashboard pages and API reads, runs a steady acquire load
// and receives webhooks. Standard library only; built with go build -o X ./.ci/scale (Go's
// ./... skips dot-directories, so no other make target builds or vets it).
//
//	scale seed  -url U -n N -info FILE     N keys: acquires, retries, conflicts, outcomes, releases, re-admissions
//	scale pages -url U -pass P -out FILE   median and max of 5 requests per page, the CSV export's rate
//	scale load  -url U -rate R -stop FILE  new-key acquires at a fixed rate; prints the latency percentiles
//	scale sink  -portfile FILE             a webhook receiver that answers 204
//
// The API key comes from IDEMGATE_API_KEY. Every command is bounded in time (-max).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: scale seed|pages|load|sink [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "seed":
		err = seed(ctx, args)
	case "pages":
		err = pages(ctx, args)
	case "load":
		err = load(ctx, args)
	case "sink":
		err = sink(ctx, args)
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale "+os.Args[1]+":", err)
		os.Exit(1)
	}
}

// newClient is an HTTP client that keeps a connection per concurrent caller alive (the
// default keeps 2 per host, and every other request would pay a new connection).
func newClient(conns int, timeout time.Duration) *http.Client {
	tr := &http.Transport{
		Proxy:               nil, // loopback only, whatever the environment says
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        conns * 2,
		MaxIdleConnsPerHost: conns * 2,
		IdleConnTimeout:     90 * time.Second,
	}
	return &http.Client{Transport: tr, Timeout: timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// api is the JSON API with one API key.
type api struct {
	base, key string
	c         *http.Client
}

// call sends one JSON request and returns the status and body. A transport error or a 503
// (store_unavailable: nothing is known to have happened) is retried with backoff, up to 8
// times; every request the seed sends is safe to repeat (acquires carry an attempt_id, a
// repeated outcome changes nothing, a repeated release answers 404 key_not_held).
func (a *api) call(ctx context.Context, method, path string, body any) (int, []byte, error) {
	var raw []byte
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return 0, nil, err
		}
	}
	wait := 100 * time.Millisecond
	for try := 0; ; try++ {
		req, err := http.NewRequestWithContext(ctx, method, a.base+path, bytes.NewReader(raw))
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("Authorization", "Bearer "+a.key)
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := a.c.Do(req)
		status, out := 0, []byte(nil)
		if err == nil {
			out, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			status = resp.StatusCode
		}
		if (err == nil && status != http.StatusServiceUnavailable) || try == 8 || ctx.Err() != nil {
			if err != nil {
				return 0, nil, err
			}
			return status, out, nil
		}
		retries.Add(1)
		select {
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

var retries atomic.Int64

// ---- seed ----

// The key scheme. Key i is order:<a>:<b>:<i> with a (0-9) and b (0-99) from a hash of i, so a
// prefix search for order:3:12 matches about 1 key in 1,000, spread over the whole time range.
// What happens to key i is decided by another hash of i:
const (
	classSucceeded = iota // ~90%: outcome succeeded (receipt and stored response)
	classFailed           // 4%: outcome failed (half of them with release)
	classReleased         // 3%: released by its owner (POST /v1/release)
	classUncertain        // 2%: no outcome, TTL 1 s: the reaper pass after the seed makes it uncertain
	classReadmit          // 1%: succeeded, TTL 1 s, then acquired again: 201 with previous_operation
)

func mix(x uint64) uint64 { // splitmix64
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func keyOf(i int) string {
	h := mix(uint64(i))
	return fmt.Sprintf("order:%d:%d:%d", h%10, (h/10)%100, i)
}

func classOf(i int) int {
	switch h := mix(uint64(i)^0x5eed) % 1000; {
	case h < 20:
		return classUncertain
	case h < 30:
		return classReadmit
	case h < 70:
		return classFailed
	case h < 100:
		return classReleased
	default:
		return classSucceeded
	}
}

// About 10% of the keys with a normal TTL get a retried duplicate (same fingerprint: 200) and
// about 1% a conflicting acquire (another fingerprint: 422), both while the key is held.
func retried(i int) bool     { return (mix(uint64(i)^0xd0b1)>>7)%10 == 0 }
func conflicting(i int) bool { return (mix(uint64(i)^0xc0f1)>>7)%100 == 0 }

var operationNames = []string{"charge", "charge", "charge", "charge", "charge", "charge", "refund", "invoice", "invoice", "email"}

type acquireItem struct {
	Key         string          `json:"key"`
	TTLSeconds  int             `json:"ttl_seconds"`
	Operation   string          `json:"operation"`
	Fingerprint string          `json:"fingerprint"`
	AttemptID   string          `json:"attempt_id"`
	Metadata    json.RawMessage `json:"metadata,omitempty"`
}

func itemOf(i, ttl int, attempt string) acquireItem {
	h := mix(uint64(i) ^ 0xf1)
	return acquireItem{Key: keyOf(i), TTLSeconds: ttl, Operation: operationNames[h%uint64(len(operationNames))],
		Fingerprint: fmt.Sprintf("sha256:%016x", h), AttemptID: fmt.Sprintf("att-%d-%s", i, attempt),
		Metadata: json.RawMessage(fmt.Sprintf(`{"order":%d,"amount":%d,"currency":"EUR"}`, i, h%100000))}
}

type batchResults struct {
	Results []struct {
		Status int `json:"status"`
		Body   struct {
			OperationID       string `json:"operation_id"`
			OwnerToken        string `json:"owner_token"`
			PreviousOperation *struct {
				State string `json:"state"`
			} `json:"previous_operation"`
		} `json:"body"`
		Problem *struct {
			Code string `json:"code"`
		} `json:"problem"`
	} `json:"results"`
}

// tally counts answers by phase and status, for the summary.
type tally struct {
	mu sync.Mutex
	m  map[string]int64
}

func (t *tally) add(phase string, status int) {
	t.mu.Lock()
	t.m[phase+" "+strconv.Itoa(status)]++
	t.mu.Unlock()
}

func (t *tally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	ks := make([]string, 0, len(t.m))
	for k := range t.m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	for _, k := range ks {
		fmt.Fprintf(&b, "  %-28s %d\n", k, t.m[k])
	}
	return b.String()
}

type job struct {
	i          int
	class      int
	op, owner  string
	readmitted bool
}

func seed(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("seed", flag.ExitOnError)
	base := fs.String("url", "", "idemgate base URL")
	n := fs.Int("n", 10000, "keys to seed")
	batch := fs.Int("batch", 500, "items per POST /v1/acquire:batch (the API's maximum is 500)")
	workers := fs.Int("workers", 4, "concurrent batch acquirers")
	conns := fs.Int("conns", 48, "concurrent outcome and release callers (one HTTP call each)")
	ttl := fs.Int("ttl", 10, "TTL of the keys that get an outcome; retries and conflicts come within it")
	info := fs.String("info", "", "file to write facts for the later steps to (operation_id=...)")
	maxDur := fs.Duration("max", 24*time.Hour, "give up after this long")
	_ = fs.Parse(args)
	ctx, cancel := context.WithTimeout(ctx, *maxDur)
	defer cancel()
	a := &api{base: *base, key: os.Getenv("IDEMGATE_API_KEY"), c: newClient(*conns+*workers, time.Minute)}
	t := &tally{m: map[string]int64{}}
	start := time.Now()
	var (
		errMu    sync.Mutex
		firstErr error
	)
	fail := func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		if err != nil && firstErr == nil {
			firstErr = err
			cancel()
		}
	}
	failed := func() error { errMu.Lock(); defer errMu.Unlock(); return firstErr }

	// Outcome and release callers: one HTTP call per key, many at once over kept-alive connections.
	jobs := make(chan job, 4*(*batch))
	var done atomic.Int64
	var owg sync.WaitGroup
	for range *conns {
		owg.Add(1)
		go func() {
			defer owg.Done()
			for j := range jobs {
				fail(finish(ctx, a, t, j))
				done.Add(1)
			}
		}()
	}

	// Batch acquirers: per chunk of keys, one batch of first acquires, then one batch of the
	// chunk's retried duplicates and conflicting acquires (while the keys are held), then the
	// chunk's outcomes and releases go to the callers above.
	chunks := make(chan int)
	var readmitMu sync.Mutex
	var readmit []job
	var lastAcquire atomic.Int64
	var bwg sync.WaitGroup
	for range *workers {
		bwg.Add(1)
		go func() {
			defer bwg.Done()
			for lo := range chunks {
				hi := min(lo+*batch, *n)
				items := make([]acquireItem, 0, hi-lo)
				for i := lo; i < hi; i++ {
					k := *ttl
					if c := classOf(i); c == classUncertain || c == classReadmit {
						k = 1
					}
					items = append(items, itemOf(i, k, "1"))
				}
				res, err := acquireBatch(ctx, a, t, "acquire", items)
				lastAcquire.Store(time.Now().UnixNano())
				if err != nil {
					fail(err)
					return
				}
				var again []acquireItem
				for i := lo; i < hi; i++ {
					if c := classOf(i); c == classUncertain || c == classReadmit {
						continue
					}
					if retried(i) {
						again = append(again, itemOf(i, *ttl, "2"))
					}
					if conflicting(i) {
						it := itemOf(i, *ttl, "c")
						it.Fingerprint = fmt.Sprintf("sha256:%016x", mix(uint64(i)^0xbad))
						again = append(again, it)
					}
				}
				if len(again) > 0 {
					if _, err := acquireBatch(ctx, a, t, "retry/conflict", again); err != nil {
						fail(err)
						return
					}
				}
				for i := lo; i < hi; i++ {
					r := res.Results[i-lo]
					if r.Status != http.StatusCreated {
						continue
					}
					j := job{i: i, class: classOf(i), op: r.Body.OperationID, owner: r.Body.OwnerToken}
					if j.class == classReadmit {
						readmitMu.Lock()
						readmit = append(readmit, j)
						readmitMu.Unlock()
					}
					if j.class != classUncertain {
						select {
						case jobs <- j:
						case <-ctx.Done():
							return
						}
					}
				}
			}
		}()
	}
	progress := time.NewTicker(30 * time.Second)
	defer progress.Stop()
feed:
	for lo := 0; lo < *n; lo += *batch {
		select {
		case chunks <- lo:
		case <-ctx.Done():
			break feed
		case <-progress.C:
			el := time.Since(start).Seconds()
			fmt.Printf("  ... %d of %d keys acquired, %d outcomes and releases sent, %.0f s, %.0f keys/s\n", lo, *n, done.Load(), el, float64(lo)/el)
			lo -= *batch // this chunk was not sent
		}
	}
	close(chunks)
	bwg.Wait()
	close(jobs)
	owg.Wait()
	if err := failed(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("seed stopped: %w (%.0f s in)", err, time.Since(start).Seconds())
	}
	mainDone := time.Since(start)

	// Re-admissions: the readmit keys' TTL of 1 s has passed (wait for it when the seed was
	// quicker than that); acquiring them again answers 201 with previous_operation (the
	// succeeded one), and the new operation succeeds too.
	time.Sleep(time.Until(time.Unix(0, lastAcquire.Load()).Add(1500 * time.Millisecond)))
	sort.Slice(readmit, func(x, y int) bool { return readmit[x].i < readmit[y].i })
	sample, withPrev := "", 0
	for lo := 0; lo < len(readmit); lo += *batch {
		part := readmit[lo:min(lo+*batch, len(readmit))]
		items := make([]acquireItem, len(part))
		for x, j := range part {
			items[x] = itemOf(j.i, *ttl, "3")
		}
		res, err := acquireBatch(ctx, a, t, "re-admission", items)
		lastAcquire.Store(time.Now().UnixNano())
		if err != nil {
			return err
		}
		var wg sync.WaitGroup
		sem := make(chan struct{}, *conns)
		for x, r := range res.Results {
			if r.Status != http.StatusCreated {
				continue
			}
			if r.Body.PreviousOperation != nil {
				withPrev++
			}
			if sample == "" {
				sample = r.Body.OperationID
			}
			wg.Add(1)
			sem <- struct{}{}
			go func(j job) {
				defer func() { <-sem; wg.Done() }()
				fail(finish(ctx, a, t, j))
			}(job{i: part[x].i, class: classSucceeded, op: r.Body.OperationID, owner: r.Body.OwnerToken, readmitted: true})
		}
		wg.Wait()
	}
	if err := failed(); err != nil {
		return err
	}
	total := time.Since(start)
	fmt.Printf("seeded %d keys in %.1f s: %.0f keys/s (first acquires, retries, conflicts and outcomes: %.1f s; %d re-admissions, %d with previous_operation: %.1f s)\n",
		*n, total.Seconds(), float64(*n)/total.Seconds(), mainDone.Seconds(), len(readmit), withPrev, (total - mainDone).Seconds())
	fmt.Printf("answers by step and status (503s retried: %d):\n%s", retries.Load(), t)
	if sample == "" { // no re-admission at this N: any operation will do
		_, body, err := a.call(ctx, http.MethodGet, "/v1/keys?limit=1", nil)
		if err == nil {
			var kp struct {
				Items []struct {
					Operation struct {
						ID string `json:"id"`
					} `json:"operation"`
				} `json:"items"`
			}
			if json.Unmarshal(body, &kp) == nil && len(kp.Items) > 0 {
				sample = kp.Items[0].Operation.ID
			}
		}
	}
	// Wait for the last holds to expire, so that the reaper pass the script runs next finds
	// every hold of this seed expired (and the uncertain keys' operations to mark).
	time.Sleep(time.Until(time.Unix(0, lastAcquire.Load()).Add(time.Duration(*ttl)*time.Second + time.Second)))
	if *info != "" {
		return os.WriteFile(*info, []byte("operation_id="+sample+"\n"), 0o644)
	}
	return nil
}

func acquireBatch(ctx context.Context, a *api, t *tally, phase string, items []acquireItem) (*batchResults, error) {
	status, body, err := a.call(ctx, http.MethodPost, "/v1/acquire:batch", map[string]any{"items": items})
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("POST /v1/acquire:batch answered %d: %.300s", status, body)
	}
	var res batchResults
	if err := json.Unmarshal(body, &res); err != nil || len(res.Results) != len(items) {
		return nil, fmt.Errorf("POST /v1/acquire:batch: unexpected answer (%v): %.300s", err, body)
	}
	for _, r := range res.Results {
		t.add(phase, r.Status)
	}
	return &res, nil
}

// finish records key j's outcome or releases it, by its class.
func finish(ctx context.Context, a *api, t *tally, j job) error {
	var (
		phase, path string
		body        map[string]any
	)
	receipt := fmt.Sprintf("ch_%012x", mix(uint64(j.i)^0x7ec))
	switch j.class {
	case classSucceeded, classReadmit:
		phase, path = "outcome succeeded", "/v1/operations/"+j.op+"/outcome"
		if j.readmitted {
			phase = "re-admission outcome"
		}
		body = map[string]any{"owner_token": j.owner, "status": "succeeded", "receipt": receipt,
			"response": map[string]any{"charge": receipt, "status": "paid"}}
	case classFailed:
		phase, path = "outcome failed", "/v1/operations/"+j.op+"/outcome"
		body = map[string]any{"owner_token": j.owner, "status": "failed", "note": "card declined", "release": j.i%2 == 0}
	case classReleased:
		phase, path = "release", "/v1/release"
		body = map[string]any{"key": keyOf(j.i), "owner_token": j.owner, "reason": "order cancelled before the charge"}
	default:
		return nil
	}
	status, _, err := a.call(ctx, http.MethodPost, path, body)
	if err != nil {
		if ctx.Err() != nil {
			return nil // reported by the caller
		}
		return err
	}
	t.add(phase, status)
	return nil
}

// ---- pages ----

type target struct {
	label, path string
	api         bool
}

func pages(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("pages", flag.ExitOnError)
	base := fs.String("url", "", "idemgate base URL")
	user := fs.String("user", "admin", "dashboard account (an admin)")
	pass := fs.String("pass", "", "its password")
	prefix := fs.String("prefix", "order:3:12", "key prefix to search for")
	op := fs.String("op", "", "operation id for /operations/{id}")
	reps := fs.Int("reps", 5, "timed requests per page, after one warm-up")
	out := fs.String("out", "", "file for the rows: label status median_ms max_ms")
	maxDur := fs.Duration("max", 2*time.Hour, "give up after this long")
	_ = fs.Parse(args)
	ctx, cancel := context.WithTimeout(ctx, *maxDur)
	defer cancel()

	// The browser: a cookie jar and no redirects followed. Sign in as a form does: GET /login
	// for the CSRF token (and its cookie), then POST it back with the credentials.
	c := newClient(4, 10*time.Minute)
	c.Jar, _ = cookiejar.New(nil)
	_, body, err := fetch(ctx, c, *base+"/login", nil)
	if err != nil {
		return err
	}
	m := regexp.MustCompile(`name="_csrf"[^>]*value="([^"]+)"`).FindSubmatch(body)
	if m == nil {
		return errors.New("GET /login: no _csrf field")
	}
	form := url.Values{"username": {*user}, "password": {*pass}, "_csrf": {string(m[1])}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, *base+"/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") == "/login" {
		return fmt.Errorf("POST /login answered %d (Location %q): not signed in", resp.StatusCode, resp.Header.Get("Location"))
	}

	now := time.Now().UTC().Truncate(time.Second)
	// The 31-day audit range is given with both ends: with only from, to is the database's
	// now a moment later and the span just over 31 days, which the audit refuses (400).
	month := url.Values{"from": {now.Add(-31 * 24 * time.Hour).Format(time.RFC3339)}, "to": {now.Format(time.RFC3339)}}
	q := url.QueryEscape(*prefix)
	ts := []target{
		{"overview /", "/", false},
		{"overview ?range=7d", "/?range=7d", false},
		{"keys /keys", "/keys", false},
		{"keys ?prefix=" + *prefix, "/keys?prefix=" + q, false},
		{"keys ?state=uncertain", "/keys?state=uncertain", false},
		{"keys ?state=released", "/keys?state=released", false},
		{"reconciliation queue", "/reconciliation", false},
		{"operation /operations/{id}", "/operations/" + *op, false},
		{"audit (24 h)", "/audit", false},
		{"audit 31 days", "/audit?" + month.Encode(), false},
		{"audit ?flagged=1 (24 h)", "/audit?flagged=1", false},
		{"webhook deliveries", "/webhooks", false},
		{"GET /v1/keys", "/v1/keys", true},
		{"GET /v1/keys?prefix=" + *prefix, "/v1/keys?prefix=" + q, true},
		{"GET /v1/operations?state=uncertain", "/v1/operations?state=uncertain", true},
	}
	var rows bytes.Buffer
	key := os.Getenv("IDEMGATE_API_KEY")
	for _, tg := range ts {
		hdr := http.Header{}
		if tg.api {
			hdr.Set("Authorization", "Bearer "+key)
		}
		var ms []float64
		statuses := map[int]bool{}
		for r := 0; r <= *reps; r++ { // r == 0 is the warm-up
			t0 := time.Now()
			status, _, err := fetch(ctx, c, *base+tg.path, hdr)
			el := float64(time.Since(t0).Microseconds()) / 1000
			if err != nil {
				return fmt.Errorf("%s: %w", tg.path, err)
			}
			if r > 0 {
				ms = append(ms, el)
				statuses[status] = true
			}
		}
		slices.Sort(ms)
		var codes []string
		for s := range statuses {
			codes = append(codes, strconv.Itoa(s))
		}
		sort.Strings(codes)
		fmt.Fprintf(&rows, "%s\t%s\t%.1f\t%.1f\n", tg.label, strings.Join(codes, "/"), ms[len(ms)/2], ms[len(ms)-1])
	}

	// The CSV export over the same 31 days, streamed: rows, time, and whether the last line is
	// the export's error row (it has sent 200 long before it could fail).
	t0 := time.Now()
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, *base+"/audit.csv?"+month.Encode(), nil)
	resp, err = c.Do(req)
	if err != nil {
		return fmt.Errorf("/audit.csv: %w", err)
	}
	lines, last, err := countLines(resp.Body)
	resp.Body.Close()
	el := time.Since(t0).Seconds()
	if err != nil {
		return fmt.Errorf("/audit.csv after %d lines: %w", lines, err)
	}
	rowsN := max(lines-1, 0) // the header
	errLine := strings.HasPrefix(last, "ERROR")
	if errLine {
		rowsN--
	}
	fmt.Fprintf(&rows, "csv\t%d\t%d\t%.2f\t%.0f\t%v\n", resp.StatusCode, rowsN, el, float64(rowsN)/el, errLine)
	if *out == "" {
		_, err = os.Stdout.Write(rows.Bytes())
		return err
	}
	return os.WriteFile(*out, rows.Bytes(), 0o644)
}

func fetch(ctx context.Context, c *http.Client, u string, hdr http.Header) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// countLines counts the lines of r and returns the last non-empty one.
func countLines(r io.Reader) (int, string, error) {
	buf := make([]byte, 256<<10)
	n, last, tail := 0, "", []byte{}
	for {
		k, err := r.Read(buf)
		chunk := buf[:k]
		n += bytes.Count(chunk, []byte{'\n'})
		if k > 0 {
			tail = append(tail, chunk...)
			if len(tail) > 8192 {
				tail = tail[len(tail)-8192:]
			}
		}
		if err == io.EOF {
			ls := strings.Split(strings.TrimRight(string(tail), "\n"), "\n")
			last = ls[len(ls)-1]
			return n, last, nil
		}
		if err != nil {
			return n, last, err
		}
	}
}

// ---- load ----

func load(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("load", flag.ExitOnError)
	base := fs.String("url", "", "idemgate base URL")
	rate := fs.Int("rate", 300, "acquires per second, each a new key")
	conns := fs.Int("conns", 128, "most requests in flight")
	startFile := fs.String("start", "", "count only the requests due once this file exists")
	stopFile := fs.String("stop", "", "stop when this file exists")
	maxDur := fs.Duration("max", time.Minute, "stop after this long")
	_ = fs.Parse(args)
	ctx, cancel := context.WithTimeout(ctx, *maxDur)
	defer cancel()
	a := &api{base: *base, key: os.Getenv("IDEMGATE_API_KEY"), c: newClient(*conns, 30*time.Second)}
	nonce := time.Now().UnixNano()
	type sample struct {
		due time.Time
		ms  float64
		ok  bool
	}
	var (
		mu      sync.Mutex
		samples []sample
		wg      sync.WaitGroup
		sem     = make(chan struct{}, *conns)
		period  = time.Second / time.Duration(*rate)
	)
	exists := func(f string) bool { _, err := os.Stat(f); return f != "" && err == nil }
	start := time.Now()
	from := start // the measured window's start: now, or when the start file appears
	counting := *startFile == ""
	var end time.Time
	for k := 0; ; k++ {
		// Open loop: request k is due at start + k*period whatever the answers so far, and its
		// latency counts from then, so a stall is measured in full rather than hidden by the
		// requests it kept from being sent (coordinated omission).
		due := start.Add(time.Duration(k) * period)
		if d := time.Until(due); d > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
		if k%(*rate/100+1) == 0 { // the files are looked at about every 10 ms
			if !counting && exists(*startFile) {
				counting, from = true, due
			}
			if exists(*stopFile) {
				cancel()
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			end = time.Now()
			break
		}
		wg.Add(1)
		go func(k int, due time.Time) {
			defer func() { <-sem; wg.Done() }()
			body := map[string]any{"key": fmt.Sprintf("load:%x:%d", nonce, k), "ttl_seconds": 60}
			req, _ := http.NewRequest(http.MethodPost, a.base+"/v1/acquire", bytes.NewReader(must(json.Marshal(body))))
			req.Header.Set("Authorization", "Bearer "+a.key)
			req.Header.Set("Content-Type", "application/json")
			resp, err := a.c.Do(req)
			ok := err == nil
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				ok = resp.StatusCode == http.StatusCreated
			}
			ms := float64(time.Since(due).Microseconds()) / 1000
			mu.Lock()
			samples = append(samples, sample{due, ms, ok})
			mu.Unlock()
		}(k, due)
	}
	wg.Wait()
	var lat []float64
	errs := 0
	for _, s := range samples {
		if counting && !s.due.Before(from) {
			lat = append(lat, s.ms)
			if !s.ok {
				errs++
			}
		}
	}
	if len(lat) == 0 {
		return errors.New("no request was sent in the measured window")
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	fmt.Printf("%d %.1f %.2f %.2f %.2f %d\n", len(lat), end.Sub(from).Seconds(), pct(0.50), pct(0.99), lat[len(lat)-1], errs)
	return nil
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// ---- sink ----

// sink receives the webhook deliveries of the seeded databases, so the delivery log holds
// delivered rows (as in a deployment whose receiver is up) and the dispatcher no retries.
func sink(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sink", flag.ExitOnError)
	portFile := fs.String("portfile", "", "write the port listened on here")
	maxDur := fs.Duration("max", 24*time.Hour, "stop after this long")
	_ = fs.Parse(args)
	ctx, cancel := context.WithTimeout(ctx, *maxDur)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	var got atomic.Int64
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})}
	if err := os.WriteFile(*portFile, []byte(strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)), 0o644); err != nil {
		return err
	}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	fmt.Fprintf(os.Stderr, "scale sink: %d deliveries received\n", got.Load())
	return nil
}
