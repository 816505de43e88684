package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// DefaultTimeout bounds a whole call, retries included, unless WithTimeout says otherwise.
const DefaultTimeout = 30 * time.Second

// maxAnswerBytes bounds an answer body the client reads: an operation with 1000 attempts and
// events and a 64 KiB stored response is far smaller.
const maxAnswerBytes = 16 << 20

// Client calls idemgate's JSON API (docs/reference.md §4). It is safe for concurrent use; create one per
// API key and share it.
type Client struct {
	base      string // scheme://host[:port][/path], no trailing slash
	apiKey    string
	hc        *http.Client
	timeout   time.Duration
	retry     RetryPolicy
	notify    func(RetryEvent)
	userAgent string
	now       func() time.Time
}

// Option configures a Client in New.
type Option func(*Client)

// WithHTTPClient sets the *http.Client that sends requests (its Transport, proxies, TLS and
// connection pool). Default: a client with http.DefaultTransport and no timeout of its own
// (the per-call and per-try timeouts apply).
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.hc = hc
		}
	}
}

// WithTimeout bounds every call, all its tries and waits included (default 30 s; 0 means
// no bound beyond the caller's context). RetryPolicy.TryTimeout bounds each try.
func WithTimeout(d time.Duration) Option {
	return func(c *Client) { c.timeout = max(d, 0) }
}

// WithRetry sets the retry policy; zero fields take their defaults, and
// RetryPolicy{MaxAttempts: 1} disables retries.
func WithRetry(p RetryPolicy) Option {
	return func(c *Client) { c.retry = p.withDefaults() }
}

// WithRetryNotify calls fn before each retry wait, e.g. to log or count retries. fn runs on
// the calling goroutine and must not block.
func WithRetryNotify(fn func(RetryEvent)) Option {
	return func(c *Client) { c.notify = fn }
}

// WithUserAgent sets the User-Agent header (default "idemgate-go-client").
func WithUserAgent(ua string) Option {
	return func(c *Client) { c.userAgent = ua }
}

// New returns a client of the idemgate server at baseURL (e.g. "http://127.0.0.1:8080"; a
// path prefix is kept, for a server behind a reverse proxy) that authenticates with apiKey,
// the tenant's API key (docs/reference.md §4: the key decides the tenant). It returns an error for a
// baseURL that is not an absolute http or https URL, or an empty apiKey.
func New(baseURL, apiKey string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("idemgate client: base URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("idemgate client: base URL %q must be http(s)://host[:port][/path]", baseURL)
	}
	if strings.TrimSpace(apiKey) == "" {
		return nil, errors.New("idemgate client: the API key is empty")
	}
	c := &Client{
		base:      strings.TrimSuffix(u.String(), "/"),
		apiKey:    apiKey,
		hc:        &http.Client{},
		timeout:   DefaultTimeout,
		retry:     RetryPolicy{}.withDefaults(),
		userAgent: "idemgate-go-client",
		now:       time.Now,
	}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Acquire asks whether this attempt may run the operation keyed req.Key (docs/reference.md §4
// "POST /v1/acquire"). The result has Admitted set (201: run it, then RecordOutcome or
// Release with the owner token) or Duplicate set (200: an earlier attempt holds the key;
// return or reconcile its outcome instead of running again).
//
// Retries are safe: every try carries the same attempt_id (req.AttemptID, or a random UUID
// the client generates and reports in AcquireResult.AttemptID), so a try whose 201 was lost
// is answered 201 again for the same operation and fencing token, with a fresh owner token;
// a lost response is never a lost admission.
//
// Errors (*Problem, match with errors.Is): ErrFingerprintMismatch (422: the key is held by a
// request with another fingerprint or operation name), ErrInvalidRequest (with Errors),
// ErrPayloadTooLarge, ErrUnauthorized, ErrRateLimited and ErrStoreUnavailable (after
// retries); ErrUnexpectedAnswer for a 2xx that is neither a 201 with state in_progress nor a
// 200 duplicate with its operation (never reported as admitted: do not run the effect, read
// the key or operation to reconcile); otherwise a network error or the context's error.
//
// A retry with the same attempt_id after the operation got an outcome (whoever recorded it)
// is answered as a duplicate, with that outcome; so is an attempt_id sent by another API key
// than the one that acquired, since the server honours an attempt_id only for its creator.
func (c *Client) Acquire(ctx context.Context, req AcquireRequest) (*AcquireResult, error) {
	body, err := acquireBodyOf(req)
	if err != nil {
		return nil, err
	}
	var ans acquireAnswer
	sentAt := time.Now()
	status, err := c.do(ctx, http.MethodPost, acquirePath, nil, body, &ans, http.StatusOK, http.StatusCreated)
	if err != nil {
		return nil, err
	}
	return acquireResultOf(acquirePath, body, status, ans, sentAt)
}

const (
	acquirePath      = "/v1/acquire"
	acquireBatchPath = "/v1/acquire:batch"
)

// acquireBodyOf is the wire body of req, with its attempt_id: req.AttemptID, or a new random
// UUID that every try of the call then sends. Errors: an invalid argument (*Problem matching
// ErrInvalidRequest), nothing sent.
func acquireBodyOf(req AcquireRequest) (acquireBody, error) {
	if req.TTL%time.Second != 0 {
		return acquireBody{}, invalidArgument("ttl_seconds", "TTL must be a whole number of seconds")
	}
	if req.Lease < 0 || req.Lease%time.Second != 0 {
		return acquireBody{}, invalidArgument("lease_seconds", "Lease must be a whole number of seconds")
	}
	body := acquireBody{Key: req.Key, TTLSeconds: int64(req.TTL / time.Second), Operation: req.Operation,
		Fingerprint: req.Fingerprint, CorrelationID: req.CorrelationID, AttemptID: req.AttemptID,
		LeaseSeconds: int64(req.Lease / time.Second), OnExpiry: req.OnExpiry}
	if body.AttemptID == "" {
		body.AttemptID = uuid.NewString()
	}
	if req.Metadata != nil {
		m, err := json.Marshal(req.Metadata)
		if err != nil {
			return acquireBody{}, invalidArgument("metadata", "cannot be marshalled to JSON: "+err.Error())
		}
		if string(m) != "null" {
			body.Metadata = m
		}
	}
	return body, nil
}

// acquireResultOf reads a 2xx acquire answer for body (from path): admitted only for a 201
// with state in_progress, a duplicate only for a 200 with the holder's operation, anything
// else an error wrapping ErrUnexpectedAnswer.
// sentAt is when the call started, for the admission's local lease deadline.
func acquireResultOf(path string, body acquireBody, status int, ans acquireAnswer, sentAt time.Time) (*AcquireResult, error) {
	res := &AcquireResult{Key: ans.Key, AttemptID: body.AttemptID}
	switch {
	case status == http.StatusCreated && ans.Admitted && ans.Admission.State == StateInProgress:
		// Admitted tells the caller to run the effect, so it is reported only for exactly
		// what the server promises that for. A 201 with any other state (a faulty server or
		// proxy) falls to the error below: not admitted, and not a duplicate either, since
		// it carries no operation to return.
		adm := ans.Admission
		adm.lease, adm.sentAt = time.Duration(body.LeaseSeconds)*time.Second, sentAt
		if adm.lease == 0 {
			adm.lease = time.Duration(body.TTLSeconds) * time.Second
		}
		if adm.lease == 0 || (adm.LeaseSeconds > 0 && time.Duration(adm.LeaseSeconds)*time.Second < adm.lease) {
			// The policy's lease (the request sent none), or a shorter one than asked: what the
			// server granted decides the local deadline.
			adm.lease = time.Duration(adm.LeaseSeconds) * time.Second
		}
		res.Admitted = &adm
		return res, nil
	case status == http.StatusOK && !ans.Admitted && ans.Operation != nil:
		ans.Operation.normalize()
		res.Duplicate = ans.Operation
		return res, nil
	}
	return nil, wrapf(http.MethodPost, path, fmt.Errorf("%w: status %d, admitted %t, state %q",
		ErrUnexpectedAnswer, status, ans.Admitted, ans.Admission.State))
}

// AcquireBatch asks, in one request (docs/reference.md §4 "POST /v1/acquire:batch"), what Acquire would
// answer each of reqs (1 to MaxBatchItems), decided in order: two requests with the same key
// are decided one after the other, the later one seeing the earlier (a duplicate of it, or
// ErrFingerprintMismatch). It returns one BatchResult per request, in the same order, each
// holding what Acquire would have returned for it: Result (Admitted or Duplicate, as Acquire)
// or Err (ErrFingerprintMismatch, ErrInvalidRequest with Errors, ErrPayloadTooLarge for an
// item over 256 KiB, an invalid argument the client found before sending, which leaves the
// item out of the request, or an error wrapping ErrUnexpectedAnswer). Items are independent:
// one refused item does not refuse the others.
//
// Retries are safe as for Acquire: every item carries its attempt_id (its own AttemptID, or a
// random UUID the client generates and reports in AcquireResult.AttemptID), the same on every
// try, so a try whose answer was lost is answered again with the same admissions.
//
// The error is for the whole call, and then no result is returned: an invalid argument (no
// request, more than MaxBatchItems), ErrInvalidRequest or ErrPayloadTooLarge (the request
// over MaxBatchBodyBytes), ErrUnauthorized, ErrRateLimited, ErrStoreUnavailable (after
// retries), ErrUnexpectedAnswer for an answer without one result per item sent, a network
// error or the context's error.
func (c *Client) AcquireBatch(ctx context.Context, reqs []AcquireRequest) ([]BatchResult, error) {
	if len(reqs) < 1 || len(reqs) > MaxBatchItems {
		return nil, invalidArgument("items", fmt.Sprintf("must hold 1 to %d acquire requests", MaxBatchItems))
	}
	out := make([]BatchResult, len(reqs))
	bodies := make([]acquireBody, 0, len(reqs))
	idx := make([]int, 0, len(reqs))
	for i, req := range reqs {
		body, err := acquireBodyOf(req)
		if err != nil {
			out[i].Err = err
			continue
		}
		bodies = append(bodies, body)
		idx = append(idx, i)
	}
	if len(bodies) == 0 {
		return out, nil
	}
	var ans acquireBatchAnswer
	sentAt := time.Now()
	if _, err := c.do(ctx, http.MethodPost, acquireBatchPath, nil, acquireBatchBody{Items: bodies}, &ans, http.StatusOK); err != nil {
		return nil, err
	}
	if len(ans.Results) != len(bodies) {
		return nil, wrapf(http.MethodPost, acquireBatchPath, fmt.Errorf("%w: %d results for %d items",
			ErrUnexpectedAnswer, len(ans.Results), len(bodies)))
	}
	for j, r := range ans.Results {
		i, body := idx[j], bodies[j]
		switch {
		case r.Status >= 400 && r.Problem != nil:
			out[i].Err = decodeProblem(r.Status, http.Header{"Content-Type": {"application/problem+json"}}, r.Problem, time.Time{})
		case r.Status >= 200 && r.Status < 300 && r.Body != nil:
			var a acquireAnswer
			if err := json.Unmarshal(r.Body, &a); err != nil {
				out[i].Err = wrapf(http.MethodPost, acquireBatchPath, fmt.Errorf("%w: item %d: %w", ErrUnexpectedAnswer, j, err))
				continue
			}
			if a.Key != body.Key {
				// Only from a faulty server or proxy: a result about another key than its
				// item's must not be acted on.
				out[i].Err = wrapf(http.MethodPost, acquireBatchPath, fmt.Errorf("%w: item %d answered for another key",
					ErrUnexpectedAnswer, j))
				continue
			}
			out[i].Result, out[i].Err = acquireResultOf(acquireBatchPath, body, r.Status, a, sentAt)
		default:
			out[i].Err = wrapf(http.MethodPost, acquireBatchPath, fmt.Errorf("%w: item %d: status %d without its body or problem",
				ErrUnexpectedAnswer, j, r.Status))
		}
	}
	return out, nil
}

// Release releases the key's hold, owner-checked (docs/reference.md §4 "POST /v1/release"): the
// operation becomes released and the key may be admitted again. It returns the released
// operation.
//
// Errors (*Problem): ErrNotOwner (409: the token does not own the current hold, including a
// hold another attempt acquired since), ErrEffectConfirmed (the operation succeeded),
// ErrOutcomeUncertain (reconcile first), ErrKeyNotHeld (404: no live hold, e.g. it expired),
// ErrInvalidRequest, ErrUnauthorized, ErrRateLimited, ErrStoreUnavailable. None of the
// refusals change anything.
//
// Retrying is safe: the release is a compare-and-delete on the owner's hold, so it cannot act
// twice. But when a try's answer was lost after the server released, the server answers the
// retry key_not_held (or not_owner once another attempt took the key), as docs/reference.md §4 says. So
// when a retried release is refused that way and req.OperationID is set, Release reads that
// operation: if it is released, the earlier try did it, and Release returns it with no error.
// Without req.OperationID such a refusal is returned with Problem.Attempts > 1.
func (c *Client) Release(ctx context.Context, req ReleaseRequest) (*Operation, error) {
	var ans releaseAnswer
	if _, err := c.do(ctx, http.MethodPost, "/v1/release", nil,
		releaseBody{Key: req.Key, OwnerToken: req.OwnerToken, Reason: req.Reason}, &ans, http.StatusOK); err != nil {
		var p *Problem
		if req.OperationID == "" || !errors.As(err, &p) || p.Attempts < 2 ||
			!(errors.Is(err, ErrKeyNotHeld) || errors.Is(err, ErrNotOwner)) {
			return nil, err
		}
		if d, gerr := c.GetOperation(ctx, req.OperationID); gerr == nil && d.State == StateReleased && d.Key == req.Key {
			return &d.Operation, nil
		}
		return nil, err
	}
	ans.Operation.normalize()
	return &ans.Operation, nil
}

// RecordOutcome records the outcome of operation operationID, owner-checked, per the state
// machine of docs/reference.md §3 (docs/reference.md §4 "POST /v1/operations/{id}/outcome"). It works after the
// hold expired. Recording the same outcome again (equal status, receipt and response)
// succeeds and changes nothing, so retries are safe. It returns the updated operation.
//
// Errors (*Problem): ErrNotOwner (403, checked first), ErrNotFound (404), ErrInvalidTransition
// (409, including a different outcome after a terminal one), ErrPayloadTooLarge (413: the
// response is over 64 KiB; nothing changes), ErrInvalidRequest, ErrUnauthorized,
// ErrRateLimited, ErrStoreUnavailable.
func (c *Client) RecordOutcome(ctx context.Context, operationID string, req OutcomeRequest) (*Operation, error) {
	if operationID == "" {
		return nil, invalidArgument("operation_id", "must not be empty")
	}
	body := outcomeBody{OwnerToken: req.OwnerToken, Status: req.Status, Receipt: req.Receipt, Note: req.Note,
		Release: req.Release}
	if req.Response != nil {
		r, err := json.Marshal(req.Response)
		if err != nil {
			return nil, invalidArgument("response", "cannot be marshalled to JSON: "+err.Error())
		}
		if string(r) != "null" {
			body.Response = r
		}
	}
	var op Operation
	if _, err := c.do(ctx, http.MethodPost, "/v1/operations/"+url.PathEscape(operationID)+"/outcome", nil, body,
		&op, http.StatusOK); err != nil {
		return nil, err
	}
	op.normalize()
	return &op, nil
}

// Renew extends the lease of operation operationID, owner-checked and fenced (docs/reference.md
// §8 "POST /v1/operations/{id}/renew"): the new lease ends lease (whole seconds, 1 s to 30
// days) from now, but never after the protection window (expires_at) unless extendTTL, which
// moves expires_at to at least the new lease end. It is the heartbeat of a long attempt; Do and
// Heartbeat call it for you.
//
// Errors (*Problem): ErrNotOwner (403: a wrong owner token), ErrNotFound (404),
// ErrLeaseExpired (409: the lease already lapsed and the operation is, or is becoming,
// uncertain — renewing cannot revive it), ErrInvalidTransition (409: the operation is no
// longer in_progress), ErrInvalidRequest, ErrUnauthorized, ErrRateLimited,
// ErrStoreUnavailable. A refusal changes nothing. Retrying is safe: a renew only moves the
// lease end to now+lease.
func (c *Client) Renew(ctx context.Context, operationID, ownerToken string, lease time.Duration, extendTTL bool) (*Renewal, error) {
	if operationID == "" {
		return nil, invalidArgument("operation_id", "must not be empty")
	}
	if lease < time.Second || lease%time.Second != 0 {
		return nil, invalidArgument("lease_seconds", "the lease must be a whole number of seconds, at least 1 s")
	}
	var r Renewal
	if _, err := c.do(ctx, http.MethodPost, "/v1/operations/"+url.PathEscape(operationID)+"/renew", nil,
		renewBody{OwnerToken: ownerToken, LeaseSeconds: int64(lease / time.Second), ExtendTTL: extendTTL},
		&r, http.StatusOK); err != nil {
		return nil, err
	}
	return &r, nil
}

// WaitOperation returns operation id as GetOperation does, but as soon as it is no longer
// in_progress, or once wait has passed (rounded up to whole seconds, at most MaxWait) with its
// state then, whichever comes first: a long poll (docs/reference.md §8
// "GET /v1/operations/{id}?wait="). A duplicate uses it to wait for the holder's outcome
// instead of polling. wait ≤ 0 is a plain GetOperation. The call's bounds (WithTimeout and
// RetryPolicy.TryTimeout) are stretched by wait so the long poll is not cut short.
//
// Errors: as GetOperation, plus ErrTooManyWaiters (503: the server instance has its maximum of
// waiting requests; retried after its Retry-After, then returned).
func (c *Client) WaitOperation(ctx context.Context, id string, wait time.Duration) (*OperationDetail, error) {
	if wait <= 0 {
		return c.GetOperation(ctx, id)
	}
	if id == "" {
		return nil, invalidArgument("id", "must not be empty")
	}
	secs := int64((min(wait, MaxWait) + time.Second - 1) / time.Second)
	q := url.Values{"wait": {strconv.FormatInt(secs, 10) + "s"}}
	stretch := time.Duration(secs) * time.Second
	var d OperationDetail
	if _, err := c.doStretched(ctx, stretch, http.MethodGet, "/v1/operations/"+url.PathEscape(id), q, nil, &d,
		http.StatusOK); err != nil {
		return nil, err
	}
	d.Operation.normalize()
	return &d, nil
}

// GetKey returns key and its newest operation (docs/reference.md §4 "GET /v1/keys/{key}"); the key is
// percent-encoded, so "/", ":" and non-ASCII keys round-trip. Errors: ErrNotFound (never
// acquired in this tenant), ErrUnauthorized, ErrRateLimited, ErrStoreUnavailable.
func (c *Client) GetKey(ctx context.Context, key string) (*KeyView, error) {
	if key == "" {
		return nil, invalidArgument("key", "must not be empty")
	}
	var kv KeyView
	if _, err := c.do(ctx, http.MethodGet, "/v1/keys/"+url.PathEscape(key), nil, nil, &kv, http.StatusOK); err != nil {
		return nil, err
	}
	kv.Operation.normalize()
	return &kv, nil
}

// GetOperation returns operation id with its attempts and events (docs/reference.md §4
// "GET /v1/operations/{id}"). Errors: ErrNotFound (unknown id or another tenant's),
// ErrUnauthorized, ErrRateLimited, ErrStoreUnavailable.
func (c *Client) GetOperation(ctx context.Context, id string) (*OperationDetail, error) {
	if id == "" {
		return nil, invalidArgument("id", "must not be empty")
	}
	var d OperationDetail
	if _, err := c.do(ctx, http.MethodGet, "/v1/operations/"+url.PathEscape(id), nil, nil, &d, http.StatusOK); err != nil {
		return nil, err
	}
	d.Operation.normalize()
	return &d, nil
}

// ListKeys returns one page of the tenant's keys, newest first, with their newest operation
// (docs/reference.md §4 "GET /v1/keys"); pass KeyPage.NextCursor as opts.Cursor for the next page.
// Errors: ErrInvalidRequest (a bad limit, state or cursor), ErrUnauthorized, ErrRateLimited,
// ErrStoreUnavailable.
func (c *Client) ListKeys(ctx context.Context, opts ListKeysOptions) (*KeyPage, error) {
	q := url.Values{}
	setQuery(q, "state", opts.State)
	setQuery(q, "operation", opts.Operation)
	setQuery(q, "prefix", opts.Prefix)
	setQuery(q, "cursor", opts.Cursor)
	if opts.Limit != 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	var page KeyPage
	if _, err := c.do(ctx, http.MethodGet, "/v1/keys", q, nil, &page, http.StatusOK); err != nil {
		return nil, err
	}
	for i := range page.Items {
		page.Items[i].Operation.normalize()
	}
	return &page, nil
}

// ListOperations returns one page of the tenant's reconciliation queue: every operation in
// state uncertain, whether or not a later operation of its key was admitted since, oldest first
// by the time it became uncertain (GET /v1/operations?state=uncertain). Walk it with
// OperationPage.NextCursor as opts.Cursor; an operation reconciled meanwhile leaves the queue.
// Unlike ListKeys with State uncertain, which sees only each key's newest operation, it misses
// none. Errors: ErrInvalidRequest (a state other than uncertain, a bad limit or cursor),
// ErrUnauthorized, ErrRateLimited, ErrStoreUnavailable.
func (c *Client) ListOperations(ctx context.Context, opts ListOperationsOptions) (*OperationPage, error) {
	if opts.State == "" {
		opts.State = StateUncertain
	}
	q := url.Values{}
	q.Set("state", opts.State)
	setQuery(q, "cursor", opts.Cursor)
	if opts.Limit != 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	var page OperationPage
	if _, err := c.do(ctx, http.MethodGet, "/v1/operations", q, nil, &page, http.StatusOK); err != nil {
		return nil, err
	}
	for i := range page.Items {
		page.Items[i].normalize()
	}
	return &page, nil
}

// ListAttempts returns one page of the tenant's attempt log, newest first (docs/reference.md §4
// "GET /v1/attempts"); pass AttemptPage.NextCursor as opts.Cursor for the next page. Errors:
// ErrInvalidRequest, ErrUnauthorized, ErrRateLimited, ErrStoreUnavailable.
func (c *Client) ListAttempts(ctx context.Context, opts ListAttemptsOptions) (*AttemptPage, error) {
	q := url.Values{}
	setQuery(q, "key", opts.Key)
	setQuery(q, "result", opts.Result)
	setQuery(q, "cursor", opts.Cursor)
	if !opts.Since.IsZero() {
		q.Set("since", opts.Since.UTC().Format(time.RFC3339Nano))
	}
	if opts.Limit != 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	var page AttemptPage
	if _, err := c.do(ctx, http.MethodGet, "/v1/attempts", q, nil, &page, http.StatusOK); err != nil {
		return nil, err
	}
	return &page, nil
}

func setQuery(q url.Values, name, v string) {
	if v != "" {
		q.Set(name, v)
	}
}

// do sends one call with retries (RetryPolicy) and decodes a successful answer into out. It
// returns the answer's status. path is already escaped.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body, out any, ok ...int) (int, error) {
	return c.doStretched(ctx, 0, method, path, q, body, out, ok...)
}

// doStretched is do with the call's and each try's timeout longer by stretch: the time a long
// poll may legitimately take on the server.
func (c *Client) doStretched(ctx context.Context, stretch time.Duration, method, path string, q url.Values, body, out any, ok ...int) (int, error) {
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return 0, wrapf(method, path, err)
		}
	}
	target := c.base + path
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout+stretch)
		defer cancel()
	}
	schedule := c.retry.backoff()
	var timer *time.Timer
	for try := 1; ; try++ {
		if err := ctx.Err(); err != nil {
			return 0, wrapf(method, path, err)
		}
		status, err := c.try(ctx, stretch, method, target, payload, out, ok)
		if err == nil {
			return status, nil
		}
		var p *Problem
		if errors.As(err, &p) {
			p.Attempts = try
		}
		if try >= c.retry.MaxAttempts || !retryable(ctx, err) {
			return status, c.final(method, path, err)
		}
		delay := schedule.NextBackOff()
		if p != nil && p.RetryAfter > delay {
			delay = p.RetryAfter
		}
		if dl, has := ctx.Deadline(); has && time.Until(dl) <= delay {
			// Waiting would outlast the call: the caller learns now what went wrong.
			return status, c.final(method, path, err)
		}
		if c.notify != nil {
			c.notify(RetryEvent{Method: method, Path: path, Try: try, Err: err, Delay: delay})
		}
		if timer == nil {
			timer = time.NewTimer(delay)
			defer timer.Stop()
		} else {
			timer.Reset(delay)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			return status, wrapf(method, path, fmt.Errorf("%w (while waiting to retry after: %w)", ctx.Err(), err))
		}
	}
}

// final returns the error a call ends with: a *Problem as it is, anything else wrapped with
// the call.
func (c *Client) final(method, path string, err error) error {
	var p *Problem
	if errors.As(err, &p) {
		return p
	}
	return wrapf(method, path, err)
}

// try sends one request. It returns a *Problem for a non-2xx answer, a *transportError when
// no complete answer arrived, or another error for an answer it cannot use.
func (c *Client) try(ctx context.Context, stretch time.Duration, method, target string, payload []byte, out any, ok []int) (int, error) {
	if c.retry.TryTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.retry.TryTimeout+stretch)
		defer cancel()
	}
	var rd io.Reader
	if payload != nil {
		rd = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	req.Header.Set("Accept", "application/json, application/problem+json")
	req.Header.Set("User-Agent", c.userAgent)
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, &transportError{err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if err != nil {
		return resp.StatusCode, &transportError{err}
	}
	if len(data) > maxAnswerBytes {
		return resp.StatusCode, fmt.Errorf("answer over %d bytes", maxAnswerBytes)
	}
	for _, s := range ok {
		if resp.StatusCode == s {
			if err := json.Unmarshal(data, out); err != nil {
				return resp.StatusCode, fmt.Errorf("decode %d answer: %w", resp.StatusCode, err)
			}
			return resp.StatusCode, nil
		}
	}
	return resp.StatusCode, decodeProblem(resp.StatusCode, resp.Header, data, c.now())
}
