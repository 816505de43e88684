package services

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/models"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"gorm.io/gorm"
)

// Defaults of DispatcherConfig.
const (
	// DefaultWebhookPoll is how often an idle dispatcher looks for due deliveries.
	DefaultWebhookPoll = time.Second
	// DefaultWebhookTimeout bounds one delivery attempt (connect, send, and the receiver's
	// answer).
	DefaultWebhookTimeout = 10 * time.Second
	// webhookBatch is the most deliveries one claim takes, and so the most in flight per
	// process.
	webhookBatch = 16
	// maxWebhookErrorBytes bounds the last_error recorded for an attempt.
	maxWebhookErrorBytes = 500
)

// webhookBackoff is the wait after each failed attempt, before jitter: the n-th failure waits
// webhookBackoff[n-1]. After the last one (9 attempts over about 22 hours) the delivery is
// failed for good. The shape is the one Stripe and Svix use: quick retries for a blip, then
// hours for an outage.
var webhookBackoff = []time.Duration{
	5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute, time.Hour,
	3 * time.Hour, 6 * time.Hour, 12 * time.Hour,
}

// WebhookMaxAttempts is how many times a delivery is tried before it is failed.
var WebhookMaxAttempts = len(webhookBackoff) + 1

// DispatcherConfig configures a Dispatcher; zero fields take their defaults.
type DispatcherConfig struct {
	// Poll is the pause between two claims when nothing was due; default DefaultWebhookPoll.
	Poll time.Duration
	// Timeout bounds one POST; default DefaultWebhookTimeout (10 s). The claim lease is three
	// times it, so a claim outlives the attempts it covers.
	Timeout time.Duration
	// Instance names this process in claimed_by; default hostname:pid.
	Instance string
	// Backoff replaces the retry schedule (tests); nil means the default schedule.
	Backoff []time.Duration
	// AllowPrivate lets deliveries connect to private addresses (IDEMGATE_WEBHOOK_ALLOW_PRIVATE);
	// link-local, unspecified and multicast addresses, and loopback reached other than as
	// 127.0.0.1, ::1 or localhost, are refused whatever it says (webhookAddrRefusal).
	AllowPrivate bool
}

// Dispatcher delivers the webhook outbox (docs/reference.md §10): it claims due deliveries with
// a lease, POSTs each signed by the Standard Webhooks scheme, and records the result. Several
// processes may run one each on a shared PostgreSQL database: a claim takes rows with FOR
// UPDATE SKIP LOCKED and moves them out of "due" before it commits, so no two claim the same
// row; a process that dies mid-delivery leaves its claim to lapse, and the row is delivered
// again (at least once) with the same webhook-id.
type Dispatcher struct {
	db       *models.DB
	st       store
	log      *slog.Logger
	client   *http.Client
	poll     time.Duration
	timeout  time.Duration
	lease    time.Duration
	instance string
	backoff  []time.Duration

	delivered, retried, failed atomic.Int64
}

// WebhookStats counts this process's delivery attempts by result since it started: delivered
// (2xx), retried (failed, another attempt is scheduled) and failed (the last attempt failed:
// given up). Exported as idemgate_webhook_attempts_total.
type WebhookStats struct {
	Delivered, Retried, Failed int64
}

// Stats returns the counts so far.
func (d *Dispatcher) Stats() WebhookStats {
	return WebhookStats{Delivered: d.delivered.Load(), Retried: d.retried.Load(), Failed: d.failed.Load()}
}

// NewDispatcher returns a dispatcher over db.
func NewDispatcher(db *models.DB, log *slog.Logger, cfg DispatcherConfig) *Dispatcher {
	d := &Dispatcher{db: db, st: newStore(db), log: log, poll: cfg.Poll, timeout: cfg.Timeout, instance: cfg.Instance, backoff: cfg.Backoff}
	if d.poll <= 0 {
		d.poll = DefaultWebhookPoll
	}
	if d.timeout <= 0 {
		d.timeout = DefaultWebhookTimeout
	}
	if d.backoff == nil {
		d.backoff = webhookBackoff
	}
	if d.instance == "" {
		host, _ := os.Hostname()
		d.instance = host + ":" + strconv.Itoa(os.Getpid())
	}
	d.lease = 3 * d.timeout
	// Every connection is checked after DNS (webhookDialContext); deliveries go direct, never
	// through an HTTP(S)_PROXY, whose address would be all the check saw.
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.Proxy = nil
	transport.DialContext = webhookDialContext(d.timeout, cfg.AllowPrivate)
	d.client = &http.Client{
		Timeout:   d.timeout,
		Transport: transport,
		// SSRF: a receiver's redirect is never followed; a 3xx is a failed attempt, so an
		// endpoint cannot bounce deliveries to an address its URL was not checked for.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return d
}

// Run delivers until ctx ends: a claim, the deliveries claimed (concurrently), and a pause of
// Poll whenever nothing was due. In-flight POSTs are cancelled with ctx; their rows, still
// claimed, are due again when the lease lapses.
func (d *Dispatcher) Run(ctx context.Context) {
	for ctx.Err() == nil {
		n, err := d.RunOnce(ctx)
		if err != nil && ctx.Err() == nil {
			d.log.Warn("webhook dispatch failed", "err", err)
		}
		if n == 0 || err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(d.poll):
			}
		}
	}
}

// liveEndpoint is the condition that outbox row e belongs to an endpoint neither disabled nor
// deleted: only those are delivered.
const liveEndpoint = "EXISTS (SELECT 1 FROM webhook_endpoints w WHERE w.id = e.endpoint_id AND w.disabled_at IS NULL AND w.deleted_at IS NULL)"

// claimedEvent is a claimed outbox row with what delivering it needs.
type claimedEvent struct {
	models.WebhookEvent
	Tenant string
	URL    string
	Secret string
}

// RunOnce claims up to 16 due deliveries, delivers them concurrently and records each result;
// it returns how many it claimed.
func (d *Dispatcher) RunOnce(ctx context.Context) (int, error) {
	token := d.instance + "/" + randomHex(6)
	evs, err := d.claim(ctx, token)
	if err != nil || len(evs) == 0 {
		return 0, err
	}
	var wg sync.WaitGroup
	for i := range evs {
		wg.Add(1)
		go func(ev *claimedEvent) {
			defer wg.Done()
			status, derr := d.deliver(ctx, ev)
			if ctx.Err() != nil {
				return // shutting down: the lease lapses and the row is due again
			}
			if err := d.record(context.WithoutCancel(ctx), ev, token, status, derr); err != nil {
				d.log.Warn("recording a webhook delivery failed", "msg_id", ev.MsgID, "err", err)
			}
		}(&evs[i])
	}
	wg.Wait()
	return len(evs), nil
}

// claim takes due rows of live endpoints and moves them out of "due" until the lease ends, in
// one statement. On PostgreSQL FOR UPDATE SKIP LOCKED lets concurrent claims pass each other
// instead of waiting or taking the same row; SQLite has one writer at a time, so its UPDATE
// alone is atomic.
func (d *Dispatcher) claim(ctx context.Context, token string) ([]claimedEvent, error) {
	// An idle poll is one indexed read, not a write transaction: on SQLite a claim would take
	// the single write lock every poll interval, with or without any webhook.
	now, err := d.db.Now(ctx, d.db.WithContext(ctx))
	if err != nil {
		return nil, storeError("claim webhook deliveries", err)
	}
	var due []int64
	if err := d.db.WithContext(ctx).Table("webhook_events AS e").Where("e.status = ? AND e.next_attempt_at <= ?", DeliveryPending, now).
		Where(liveEndpoint).Limit(1).Pluck("e.id", &due).Error; err != nil {
		return nil, storeError("claim webhook deliveries", err)
	}
	if len(due) == 0 {
		return nil, nil
	}
	var out []claimedEvent
	err = d.db.Tx(ctx, func(tx *gorm.DB) error {
		now, err := d.db.Now(ctx, tx)
		if err != nil {
			return err
		}
		lock := d.st.skipLocked("e")
		until := now.Add(d.lease)
		var ids []int64
		if err := tx.Raw(`UPDATE webhook_events SET next_attempt_at = ?, claimed_until = ?, claimed_by = ?
 WHERE id IN (SELECT e.id FROM webhook_events e
               WHERE e.status = 'pending' AND e.next_attempt_at <= ?
                 AND `+liveEndpoint+`
               ORDER BY e.next_attempt_at LIMIT ?`+lock+`)
RETURNING id`, until, until, token, now, webhookBatch).Scan(&ids).Error; err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		return tx.Table("webhook_events AS e").Select("e.*, t.name AS tenant, w.url AS url, w.secret AS secret").
			Joins("JOIN webhook_endpoints w ON w.id = e.endpoint_id").Joins("JOIN tenants t ON t.id = e.tenant_id").
			Where("e.id IN ?", ids).Order("e.id").Scan(&out).Error
	})
	if err != nil {
		return nil, storeError("claim webhook deliveries", err)
	}
	return out, nil
}

// WebhookPayload is the JSON body of a delivery: {type, timestamp, data}. Timestamp is when
// the state change happened (RFC 3339, UTC), not when this attempt was sent.
type WebhookPayload struct {
	Type      string             `json:"type"`
	Timestamp time.Time          `json:"timestamp"`
	Data      WebhookPayloadData `json:"data"`
}

// WebhookPayloadData is a delivery's data: the tenant, the operation as it was at the change,
// and for operation.possible_duplicate_effect the key's previous operation.
type WebhookPayloadData struct {
	Tenant            string                    `json:"tenant"`
	Operation         WebhookOperation          `json:"operation"`
	PreviousOperation *WebhookPreviousOperation `json:"previous_operation,omitempty"`
}

// WebhookOperation is the operation in a delivery. Outcome is null until one was recorded.
type WebhookOperation struct {
	ID           string          `json:"id"`
	Key          string          `json:"key"`
	Operation    *string         `json:"operation"`
	State        string          `json:"state"`
	StateReason  *string         `json:"state_reason"`
	FencingToken int64           `json:"fencing_token"`
	Outcome      *WebhookOutcome `json:"outcome"`
}

// WebhookOutcome is the recorded outcome of a delivery's operation.
type WebhookOutcome struct {
	Status  string  `json:"status"`
	Receipt *string `json:"receipt"`
}

// WebhookPreviousOperation is the previous operation of the key in a possible duplicate effect.
type WebhookPreviousOperation struct {
	ID    string `json:"id"`
	State string `json:"state"`
}

// webhookBody renders ev's body; the same row always renders the same bytes.
func webhookBody(ev *claimedEvent) ([]byte, error) {
	p := WebhookPayload{Type: ev.EventType, Timestamp: ev.OccurredAt.UTC(), Data: WebhookPayloadData{
		Tenant: ev.Tenant,
		Operation: WebhookOperation{ID: ev.OperationID, Key: ev.OpKey, Operation: ev.OpName, State: ev.OpState,
			StateReason: ev.OpStateReason, FencingToken: ev.OpFencingToken},
	}}
	if ev.OpOutcomeStatus != nil {
		p.Data.Operation.Outcome = &WebhookOutcome{Status: *ev.OpOutcomeStatus, Receipt: ev.OpOutcomeReceipt}
	}
	if ev.PreviousOperationID != nil && ev.PreviousState != nil {
		p.Data.PreviousOperation = &WebhookPreviousOperation{ID: *ev.PreviousOperationID, State: *ev.PreviousState}
	}
	return json.Marshal(p)
}

// deliver POSTs ev once and returns the HTTP status (0 if there was no answer) and, unless the
// status was 2xx, why the attempt failed.
func (d *Dispatcher) deliver(ctx context.Context, ev *claimedEvent) (int, error) {
	body, err := webhookBody(ev)
	if err != nil {
		return 0, err
	}
	wh, err := standardwebhooks.NewWebhook(ev.Secret)
	if err != nil {
		return 0, fmt.Errorf("endpoint secret unusable: %w", err)
	}
	ts := time.Now()
	sig, err := wh.Sign(ev.MsgID, ts, body)
	if err != nil {
		return 0, fmt.Errorf("signing: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ev.URL, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "idemgate-webhooks")
	req.Header.Set("webhook-id", ev.MsgID)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts.Unix(), 10))
	req.Header.Set("webhook-signature", sig)
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // lets the connection be reused
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp.StatusCode, nil
	}
	msg := "HTTP " + strconv.Itoa(resp.StatusCode)
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		msg += " (redirects are not followed)"
	}
	if s := strings.TrimSpace(string(snippet)); s != "" {
		msg += ": " + s
	}
	return resp.StatusCode, errors.New(msg)
}

// record stores one attempt's result on the row, if this claim still holds it: delivered,
// failed after the last attempt, or pending again after the backoff (with ±20 % jitter, so
// the retries of a burst spread out).
func (d *Dispatcher) record(ctx context.Context, ev *claimedEvent, token string, status int, derr error) error {
	return d.db.Tx(ctx, func(tx *gorm.DB) error {
		now, err := d.db.Now(ctx, tx)
		if err != nil {
			return err
		}
		attempts := ev.Attempts + 1
		up := map[string]any{"attempts": attempts, "last_attempt_at": now, "claimed_by": nil, "claimed_until": nil,
			"last_status": nil, "last_error": nil}
		if status != 0 {
			up["last_status"] = status
		}
		switch {
		case derr == nil:
			up["status"], up["delivered_at"] = DeliveryDelivered, now
		case attempts >= len(d.backoff)+1:
			up["status"], up["last_error"] = DeliveryFailed, truncate(derr.Error(), maxWebhookErrorBytes)
		default:
			wait := d.backoff[attempts-1]
			wait += time.Duration((mrand.Float64()*0.4 - 0.2) * float64(wait))
			up["next_attempt_at"], up["last_error"] = now.Add(wait), truncate(derr.Error(), maxWebhookErrorBytes)
		}
		res := tx.Model(&models.WebhookEvent{}).Where("id = ? AND claimed_by = ? AND status = ?", ev.ID, token, DeliveryPending).
			Updates(up)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			d.log.Warn("webhook delivery outlived its claim; the row was claimed again", "msg_id", ev.MsgID)
			return nil
		}
		switch up["status"] {
		case DeliveryDelivered:
			d.delivered.Add(1)
		case DeliveryFailed:
			d.failed.Add(1)
			d.log.Warn("webhook delivery failed for good", "msg_id", ev.MsgID, "endpoint_id", ev.EndpointID,
				"attempts", attempts, "err", derr)
		default:
			d.retried.Add(1)
		}
		return nil
	})
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b)
}
