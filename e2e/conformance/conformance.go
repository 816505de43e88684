// Package conformance checks an HTTP service against the Idempotency-Key header draft
// (draft-ietf-httpapi-idempotency-key-header-07; sentences quoted from -06's source, README.md
// says why): every MUST and SHOULD of its server side
// that can be seen over HTTP, plus the questions it leaves open on the response side, as
// cases in cases.json (data, not code: README.md lists each with the sentence it checks,
// and the contract the service under test must offer). Run runs them against a base URL;
// `go run ./e2e/conformance/run -base URL` prints the report.
package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
)

//go:embed cases.json
var casesJSON []byte

// Levels of a case: a failed MUST or SHOULD is a failure of the service; an OPEN case asks a
// question the draft leaves open and only records the answer.
const (
	LevelMust   = "MUST"
	LevelShould = "SHOULD"
	LevelOpen   = "OPEN"
)

// Case is one check: the draft's sentence it checks and the requests that check it.
type Case struct {
	ID       string `json:"id"`
	Level    string `json:"level"`
	Section  string `json:"section"`
	Sentence string `json:"sentence"`
	Steps    []Step `json:"steps"`
}

// Step is one request and what its answer must be. Async starts it without waiting (a later
// step with Await names it and checks its answer then); Save names the answer for later
// steps' comparisons.
type Step struct {
	Request *Request `json:"request,omitempty"`
	Async   bool     `json:"async,omitempty"`
	// AfterStarted names an async step: this step is sent only once that step's request has
	// started executing at the service (GET /orders/started counts past its value when the
	// async step was sent; README.md "The service under test"), so it is sure to be a retry
	// while the original is in progress, not a race for admission.
	AfterStarted string `json:"after_started,omitempty"`
	Await        string `json:"await,omitempty"`
	Save         string `json:"save,omitempty"`
	Expect       Expect `json:"expect"`
}

// Request is an HTTP request relative to the base URL. Key is the Idempotency-Key header:
// "$k1".."$k9" are fresh random keys per case run, "$k1:sf" the same key as a Structured
// Field String ("\"…\""); absent: no header. Body is sent as JSON.
type Request struct {
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Key     string            `json:"key,omitempty"`
	Body    json.RawMessage   `json:"body,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// Expect is what an answer must be; empty fields are not checked.
type Expect struct {
	Status []int `json:"status,omitempty"`
	// Problem: Content-Type is application/problem+json (RFC 9457).
	Problem bool `json:"problem,omitempty"`
	// DocLink: the answer points to documentation: a Link header with rel="describedby", or a
	// problem type that is a URI other than about:blank.
	DocLink bool `json:"doc_link,omitempty"`
	// SameAs: the status and body equal those of the saved answer of that name.
	SameAs string `json:"same_as,omitempty"`
	// DiffersFrom: the body differs from the saved answer's (the request ran again).
	DiffersFrom string `json:"differs_from,omitempty"`
	// Header: each named header matches the regular expression ("" : present at all).
	Header map[string]string `json:"header,omitempty"`
}

// Result is one case's verdict. For OPEN cases Pass says whether the service does what the
// case describes.
type Result struct {
	Case     Case
	Pass     bool
	Problems []string
}

// Cases returns the embedded cases.json. Errors: a case file that does not parse, or a case
// without an id, a known level, a sentence or steps.
func Cases() ([]Case, error) {
	var cs []Case
	if err := json.Unmarshal(casesJSON, &cs); err != nil {
		return nil, fmt.Errorf("cases.json: %w", err)
	}
	for _, c := range cs {
		if c.ID == "" || c.Sentence == "" || len(c.Steps) == 0 ||
			(c.Level != LevelMust && c.Level != LevelShould && c.Level != LevelOpen) {
			return nil, fmt.Errorf("cases.json: case %q is incomplete", c.ID)
		}
	}
	return cs, nil
}

type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
}

// Run runs every case against base (e.g. "http://127.0.0.1:3000") with hc, one case at a
// time, and returns a result per case in order.
func Run(ctx context.Context, base string, hc *http.Client, cases []Case) []Result {
	out := make([]Result, 0, len(cases))
	for _, c := range cases {
		out = append(out, runCase(ctx, strings.TrimSuffix(base, "/"), hc, c))
	}
	return out
}

func runCase(ctx context.Context, base string, hc *http.Client, c Case) Result {
	res := Result{Case: c, Pass: true}
	keys := map[string]string{}
	saved := map[string]answer{}
	pending := map[string]chan answer{}
	startedAt := map[string]int64{} // GET /orders/started when each async step was sent
	fail := func(i int, format string, args ...any) {
		res.Pass = false
		res.Problems = append(res.Problems, fmt.Sprintf("step %d: ", i+1)+fmt.Sprintf(format, args...))
	}
	for i, s := range c.Steps {
		if s.AfterStarted != "" {
			if err := waitStarted(ctx, base, hc, startedAt[s.AfterStarted]); err != nil {
				fail(i, "%v", err)
				continue
			}
		}
		var a answer
		switch {
		case s.Await != "":
			ch, ok := pending[s.Await]
			if !ok {
				fail(i, "awaits %q, which no async step started", s.Await)
				continue
			}
			a = <-ch
			delete(pending, s.Await)
			if a.err == nil {
				saved[s.Await] = a // under the async step's name, for later same_as
			}
		case s.Request != nil && s.Async:
			n, err := started(ctx, base, hc)
			if err != nil {
				fail(i, "%v", err)
				continue
			}
			startedAt[s.Save] = n
			ch := make(chan answer, 1)
			pending[s.Save] = ch
			r := *s.Request
			if r.Key != "" {
				r.Key = keyValue(r.Key, keys) // here: keys is this goroutine's alone
			}
			go func() { ch <- send(ctx, base, hc, r, nil) }()
			continue
		case s.Request != nil:
			a = send(ctx, base, hc, *s.Request, keys)
		default:
			fail(i, "has neither a request nor an await")
			continue
		}
		if a.err != nil {
			fail(i, "no answer: %v", a.err)
			continue
		}
		if s.Save != "" {
			saved[s.Save] = a
		}
		for _, p := range check(s.Expect, a, saved) {
			fail(i, "%s", p)
		}
	}
	for _, ch := range pending { // an async step nobody awaited still ends before the next case
		<-ch
	}
	return res
}

// started reads GET {base}/orders/started: how many POST /orders executions the service has
// begun.
func started(ctx context.Context, base string, hc *http.Client) (int64, error) {
	a := send(ctx, base, hc, Request{Method: http.MethodGet, Path: "/orders/started"}, nil)
	if a.err != nil {
		return 0, fmt.Errorf("GET /orders/started: %w", a.err)
	}
	var n int64
	if a.status != http.StatusOK || json.Unmarshal(a.body, &n) != nil {
		return 0, fmt.Errorf("GET /orders/started answered %d %.100s, want 200 and a number", a.status, a.body)
	}
	return n, nil
}

// waitStarted polls GET /orders/started (every 10 ms, for up to 10 s) until it passes before.
func waitStarted(ctx context.Context, base string, hc *http.Client, before int64) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for {
		n, err := started(ctx, base, hc)
		if err != nil || n > before {
			return err
		}
		select {
		case <-tick.C:
		case <-deadline:
			return fmt.Errorf("the async request did not start within 10 s (GET /orders/started stays %d)", n)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func send(ctx context.Context, base string, hc *http.Client, r Request, keys map[string]string) answer {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var body io.Reader
	if len(r.Body) > 0 {
		body = bytes.NewReader(r.Body)
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, base+r.Path, body)
	if err != nil {
		return answer{err: err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if r.Key != "" {
		req.Header.Set("Idempotency-Key", keyValue(r.Key, keys))
	}
	for k, v := range r.Headers {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: raw, err: err}
}

// keyValue resolves a Request.Key: "$kN" is a fresh random key of this case run (the same
// within it), "$kN:sf" that key as a Structured Field String; anything else (a key resolved
// already: keys may then be nil) is sent as is.
func keyValue(spec string, keys map[string]string) string {
	name, sf := strings.CutSuffix(spec, ":sf")
	if !strings.HasPrefix(name, "$k") {
		return spec
	}
	k, ok := keys[name]
	if !ok {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		k = "conformance-" + hex.EncodeToString(b)
		keys[name] = k
	}
	if sf {
		return `"` + k + `"`
	}
	return k
}

func check(e Expect, a answer, saved map[string]answer) []string {
	var out []string
	if len(e.Status) > 0 && !slices.Contains(e.Status, a.status) {
		out = append(out, fmt.Sprintf("status %d, want one of %v (body %.200s)", a.status, e.Status, a.body))
	}
	ct := a.header.Get("Content-Type")
	if e.Problem && !strings.HasPrefix(ct, "application/problem+json") {
		out = append(out, fmt.Sprintf("Content-Type %q, want application/problem+json", ct))
	}
	if e.DocLink && !docLink(a) {
		out = append(out, `no link to documentation (Link rel="describedby", or a problem type URI other than about:blank)`)
	}
	if e.SameAs != "" {
		if s, ok := saved[e.SameAs]; !ok {
			out = append(out, fmt.Sprintf("no saved answer %q", e.SameAs))
		} else if s.status != a.status || !bytes.Equal(s.body, a.body) {
			out = append(out, fmt.Sprintf("answer %d %.120s differs from %q's %d %.120s", a.status, a.body, e.SameAs, s.status, s.body))
		}
	}
	if e.DiffersFrom != "" {
		if s, ok := saved[e.DiffersFrom]; ok && bytes.Equal(s.body, a.body) {
			out = append(out, fmt.Sprintf("body equals %q's: the request was not run again", e.DiffersFrom))
		}
	}
	names := make([]string, 0, len(e.Header))
	for n := range e.Header {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		v := a.header.Get(n)
		if v == "" {
			out = append(out, fmt.Sprintf("no %s header", n))
		} else if re := e.Header[n]; re != "" && !regexp.MustCompile(re).MatchString(v) {
			out = append(out, fmt.Sprintf("%s: %q does not match %s", n, v, re))
		}
	}
	return out
}

func docLink(a answer) bool {
	for _, l := range a.header.Values("Link") {
		if strings.Contains(l, `rel="describedby"`) || strings.Contains(l, "rel=describedby") {
			return true
		}
	}
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(a.body, &p)
	return p.Type != "" && p.Type != "about:blank" && strings.Contains(p.Type, ":")
}

// Report formats results as a table: level, id, PASS/FAIL (OPEN: yes/no), and the problems.
func Report(results []Result) string {
	var b strings.Builder
	for _, r := range results {
		verdict := map[bool]string{true: "PASS", false: "FAIL"}[r.Pass]
		if r.Case.Level == LevelOpen {
			verdict = map[bool]string{true: "yes", false: "no"}[r.Pass]
		}
		fmt.Fprintf(&b, "%-6s %-34s %s\n", r.Case.Level, r.Case.ID, verdict)
		for _, p := range r.Problems {
			fmt.Fprintf(&b, "         %s\n", p)
		}
	}
	return b.String()
}
