package services

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
)

// Webhook event types (docs/reference.md §10 "Webhooks"), in the canonical order endpoints
// store and show them.
const (
	// EventOperationUncertain: an operation became uncertain (reaper, takeover, or the owner's
	// "uncertain" outcome).
	EventOperationUncertain = "operation.uncertain"
	// EventOperationReconciled: an uncertain operation got a confirmed outcome (succeeded or
	// failed, released or not).
	EventOperationReconciled = "operation.reconciled"
	// EventPossibleDuplicateEffect: an operation was admitted while the key's previous
	// operation had succeeded or was uncertain.
	EventPossibleDuplicateEffect = "operation.possible_duplicate_effect"
)

// WebhookEventTypes lists every event type in canonical order.
var WebhookEventTypes = []string{EventOperationUncertain, EventOperationReconciled, EventPossibleDuplicateEffect}

// Delivery statuses of a webhook event (WebhookDelivery.Status).
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed"
)

// webhookSecretPrefix marks a Standard Webhooks signing secret; the rest is standard base64.
const webhookSecretPrefix = "whsec_"

// maxWebhookURLBytes bounds an endpoint URL; longer ones are refused rather than cut.
const maxWebhookURLBytes = 2048

// ValidateWebhookURL returns "" if u may be a webhook endpoint, else what is wrong with it:
// an absolute https:// URL with a host, or http:// to a loopback host (127.0.0.0/8, ::1,
// localhost) for receivers on the same machine; no user info, no fragment, at most 2048
// bytes (docs/reference.md §10). Plain http to any other host is refused: the body and
// signature would cross the network in clear. A host written as an IP address must be one the
// dispatcher may connect to (webhookAddrRefusal: no link-local, unspecified or multicast
// address, loopback only as written above, private only when allowPrivate); a name is checked
// again at every connection.
func ValidateWebhookURL(u string, allowPrivate bool) string {
	if u == "" {
		return "is required"
	}
	if len(u) > maxWebhookURLBytes {
		return fmt.Sprintf("must be at most %d bytes", maxWebhookURLBytes)
	}
	for _, r := range u {
		if r <= ' ' || r == 0x7f {
			return "must not contain spaces or control characters"
		}
	}
	p, err := url.Parse(u)
	if err != nil || !p.IsAbs() || p.Opaque != "" {
		return "must be an absolute URL such as https://hooks.example.com/idemgate"
	}
	if p.User != nil {
		return "must not carry a user name or password"
	}
	if p.Fragment != "" || strings.Contains(u, "#") {
		return "must not have a fragment (#…)"
	}
	host := p.Hostname()
	if host == "" {
		return "must name a host"
	}
	if port := p.Port(); port != "" {
		if n, err := net.LookupPort("tcp", port); err != nil || n < 1 || n > 65535 {
			return "has an invalid port"
		}
	} else if strings.HasSuffix(p.Host, ":") {
		return "has an invalid port"
	}
	if why := webhookURLHostRefusal(host, allowPrivate); why != "" {
		return "must not name " + why
	}
	switch p.Scheme {
	case "https":
		return ""
	case "http":
		if isLoopbackHost(host) {
			return ""
		}
		return "must use https:// (plain http:// only to 127.0.0.1, ::1 or localhost)"
	default:
		return "must use https:// (plain http:// only to 127.0.0.1, ::1 or localhost)"
	}
}

// isLoopbackHost reports whether host (without brackets or port) is localhost or a loopback IP.
func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ParseWebhookEvents parses a comma-separated list of event types (spaces around items are
// ignored) into the canonical order, without repeats. It returns "" as the message when the
// list is valid, else what is wrong: empty, or an unknown type (docs/reference.md §10).
func ParseWebhookEvents(list string) ([]string, string) {
	seen := map[string]bool{}
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		known := false
		for _, t := range WebhookEventTypes {
			if item == t {
				known = true
			}
		}
		if !known {
			return nil, fmt.Sprintf("unknown event %q: want %s", truncate(item, 64), strings.Join(WebhookEventTypes, ", "))
		}
		seen[item] = true
	}
	var out []string
	for _, t := range WebhookEventTypes {
		if seen[t] {
			out = append(out, t)
		}
	}
	if len(out) == 0 {
		return nil, "must name at least one of " + strings.Join(WebhookEventTypes, ", ")
	}
	return out, ""
}

// truncate cuts s to at most n bytes, on a rune boundary, marking the cut with "…".
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }

// newWebhookSecret returns "whsec_" + base64 of 32 random bytes (a Standard Webhooks secret).
func newWebhookSecret() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error()) // never happens on supported platforms
	}
	return webhookSecretPrefix + base64.StdEncoding.EncodeToString(b)
}

// Webhooks manages webhook endpoints and reads their delivery log (docs/reference.md §10).
// Events are written by database triggers (models/sql/*/operations_webhook_*.sql) and sent by a Dispatcher.
type Webhooks struct {
	db  *models.DB
	log *slog.Logger
	// allowPrivate lets endpoints name private addresses (IDEMGATE_WEBHOOK_ALLOW_PRIVATE).
	allowPrivate bool
}

// NewWebhooks returns the webhook management service over db. allowPrivate lets endpoint URLs
// name private addresses (ValidateWebhookURL; IDEMGATE_WEBHOOK_ALLOW_PRIVATE).
func NewWebhooks(db *models.DB, log *slog.Logger, allowPrivate bool) *Webhooks {
	return &Webhooks{db: db, log: log, allowPrivate: allowPrivate}
}

// WebhookEndpointInput is a new endpoint: the tenant's name, the URL and the comma-separated
// event types.
type WebhookEndpointInput struct {
	Tenant string
	URL    string
	Events string
}

// WebhookEndpointInfo is an endpoint as lists show it: never its secret. Status is "active" or
// "disabled" (deleted endpoints are not listed).
type WebhookEndpointInfo struct {
	ID        int64
	Tenant    string
	URL       string
	Events    []string
	Status    string
	CreatedBy string
	CreatedAt time.Time
}

// CreatedWebhookEndpoint is the answer to a creation: the endpoint and its signing secret,
// which exists in no other answer.
type CreatedWebhookEndpoint struct {
	Endpoint WebhookEndpointInfo
	Secret   string
}

// errNoSuchTenant refuses an endpoint for a tenant that does not exist: a typo must not create
// one (issue 12).
func errNoSuchTenant(name string) error {
	return invalid(FieldError{Field: "tenant", Message: fmt.Sprintf("there is no tenant %q", truncate(name, 64))})
}

// CreateEndpoint creates an endpoint for an existing tenant, recorded as created by actor
// (an operator's username, or "cli"). Errors: ErrInvalidRequest (fields tenant, url, events),
// ErrStoreUnavailable.
func (w *Webhooks) CreateEndpoint(ctx context.Context, actor string, in WebhookEndpointInput) (*CreatedWebhookEndpoint, error) {
	var fe []FieldError
	if msg := ValidateTenantName(in.Tenant); msg != "" {
		fe = append(fe, FieldError{Field: "tenant", Message: msg})
	}
	if msg := ValidateWebhookURL(in.URL, w.allowPrivate); msg != "" {
		fe = append(fe, FieldError{Field: "url", Message: msg})
	}
	events, msg := ParseWebhookEvents(in.Events)
	if msg != "" {
		fe = append(fe, FieldError{Field: "events", Message: msg})
	}
	if len(fe) > 0 {
		return nil, invalid(fe...)
	}
	ep := models.WebhookEndpoint{URL: in.URL, Events: strings.Join(events, ","), Secret: newWebhookSecret(),
		CreatedBy: actor, CreatedAt: time.Now().UTC()}
	err := w.db.Tx(ctx, func(tx *gorm.DB) error {
		var t models.Tenant
		if err := tx.Where("name = ?", in.Tenant).Take(&t).Error; errors.Is(err, gorm.ErrRecordNotFound) {
			return errNoSuchTenant(in.Tenant)
		} else if err != nil {
			return err
		}
		ep.TenantID = t.ID
		return tx.Create(&ep).Error
	})
	if err != nil {
		return nil, storeError("create webhook endpoint", err)
	}
	w.log.InfoContext(ctx, "webhook endpoint created", "by", actor, "tenant", in.Tenant, "endpoint_id", ep.ID,
		"url", ep.URL, "events", ep.Events)
	return &CreatedWebhookEndpoint{Secret: ep.Secret, Endpoint: WebhookEndpointInfo{ID: ep.ID, Tenant: in.Tenant,
		URL: ep.URL, Events: events, Status: "active", CreatedBy: actor, CreatedAt: ep.CreatedAt}}, nil
}

// ListEndpoints returns the endpoints that are not deleted, of one tenant (by name) or of all
// when tenant is "", newest first, at most 1000, without their secrets. Errors:
// ErrInvalidRequest (an unknown tenant), ErrStoreUnavailable.
func (w *Webhooks) ListEndpoints(ctx context.Context, tenant string) ([]WebhookEndpointInfo, error) {
	var rows []struct {
		ID         int64
		Tenant     string
		URL        string
		Events     string
		CreatedBy  string
		CreatedAt  time.Time
		DisabledAt *time.Time
	}
	q := w.db.WithContext(ctx).Table("webhook_endpoints AS w").
		Select("w.id, t.name AS tenant, w.url, w.events, w.created_by, w.created_at, w.disabled_at").
		Joins("JOIN tenants t ON t.id = w.tenant_id").Where("w.deleted_at IS NULL")
	if tenant != "" {
		var n int64
		if err := w.db.WithContext(ctx).Model(&models.Tenant{}).Where("name = ?", tenant).Count(&n).Error; err != nil {
			return nil, storeError("list webhook endpoints", err)
		}
		if n == 0 {
			return nil, errNoSuchTenant(tenant)
		}
		q = q.Where("t.name = ?", tenant)
	}
	if err := q.Order("w.id DESC").Limit(maxAdminRows).Scan(&rows).Error; err != nil {
		return nil, storeError("list webhook endpoints", err)
	}
	out := make([]WebhookEndpointInfo, 0, len(rows))
	for _, r := range rows {
		status := "active"
		if r.DisabledAt != nil {
			status = "disabled"
		}
		out = append(out, WebhookEndpointInfo{ID: r.ID, Tenant: r.Tenant, URL: r.URL, Events: strings.Split(r.Events, ","),
			Status: status, CreatedBy: r.CreatedBy, CreatedAt: r.CreatedAt.UTC()})
	}
	return out, nil
}

// DeleteEndpoint deletes endpoint id on behalf of actor: no event is written for it any more,
// and its pending deliveries end as failed ("endpoint deleted") in the same transaction. The
// row is kept for the delivery log. Errors: ErrNotFound (no such endpoint, or deleted
// already), ErrStoreUnavailable.
func (w *Webhooks) DeleteEndpoint(ctx context.Context, actor string, id int64) error {
	err := w.db.Tx(ctx, func(tx *gorm.DB) error {
		now := time.Now().UTC()
		res := tx.Model(&models.WebhookEndpoint{}).Where("id = ? AND deleted_at IS NULL", id).
			Updates(map[string]any{"deleted_at": now, "deleted_by": actor})
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			return ErrNotFound
		}
		return tx.Model(&models.WebhookEvent{}).Where("endpoint_id = ? AND status = ?", id, DeliveryPending).
			Updates(map[string]any{"status": DeliveryFailed, "last_error": "endpoint deleted by " + actor,
				"claimed_by": nil, "claimed_until": nil}).Error
	})
	if err != nil {
		return storeError("delete webhook endpoint", err)
	}
	w.log.InfoContext(ctx, "webhook endpoint deleted", "by", actor, "endpoint_id", id)
	return nil
}

// SetEndpointDisabled disables (disabled true) or enables endpoint id on behalf of actor. A
// disabled endpoint gets no new events and its pending deliveries wait until it is enabled
// again. Errors: ErrNotFound, ErrStoreUnavailable.
func (w *Webhooks) SetEndpointDisabled(ctx context.Context, actor string, id int64, disabled bool) error {
	var at any
	if disabled {
		at = time.Now().UTC()
	}
	var changed int64
	err := w.db.Write(ctx, func(db *gorm.DB) error {
		res := db.Model(&models.WebhookEndpoint{}).Where("id = ? AND deleted_at IS NULL", id).Update("disabled_at", at)
		changed = res.RowsAffected
		return res.Error
	})
	if err != nil {
		return storeError("disable webhook endpoint", err)
	}
	if changed == 0 {
		return ErrNotFound
	}
	w.log.InfoContext(ctx, "webhook endpoint changed", "by", actor, "endpoint_id", id, "disabled", disabled)
	return nil
}

// AdminCreateEndpoint is CreateEndpoint on behalf of a dashboard account. Errors:
// ErrUnauthorized unless acct is a global admin, as CreateEndpoint otherwise.
func (w *Webhooks) AdminCreateEndpoint(ctx context.Context, acct *OperatorAccount, in WebhookEndpointInput) (*CreatedWebhookEndpoint, error) {
	if err := requireGlobalAdmin(acct); err != nil {
		return nil, err
	}
	return w.CreateEndpoint(ctx, acct.Username, in)
}

// AdminListEndpoints is ListEndpoints of every tenant for a dashboard account. Errors:
// ErrUnauthorized unless acct is a global admin, ErrStoreUnavailable.
func (w *Webhooks) AdminListEndpoints(ctx context.Context, acct *OperatorAccount) ([]WebhookEndpointInfo, error) {
	if err := requireGlobalAdmin(acct); err != nil {
		return nil, err
	}
	return w.ListEndpoints(ctx, "")
}

// AdminDeleteEndpoint is DeleteEndpoint for a dashboard account. Errors: ErrUnauthorized
// unless acct is a global admin, as DeleteEndpoint otherwise.
func (w *Webhooks) AdminDeleteEndpoint(ctx context.Context, acct *OperatorAccount, id int64) error {
	if err := requireGlobalAdmin(acct); err != nil {
		return err
	}
	return w.DeleteEndpoint(ctx, acct.Username, id)
}

// AdminSetEndpointDisabled is SetEndpointDisabled for a dashboard account. Errors:
// ErrUnauthorized unless acct is a global admin, as SetEndpointDisabled otherwise.
func (w *Webhooks) AdminSetEndpointDisabled(ctx context.Context, acct *OperatorAccount, id int64, disabled bool) error {
	if err := requireGlobalAdmin(acct); err != nil {
		return err
	}
	return w.SetEndpointDisabled(ctx, acct.Username, id, disabled)
}

// WebhookDelivery is one row of the delivery log: one event for one endpoint. LastStatus is
// the last HTTP status (0: no answer), NextAttemptAt is set only while Status is pending.
type WebhookDelivery struct {
	ID            int64
	MsgID         string
	EventType     string
	OperationID   string
	Tenant        string
	EndpointID    int64
	EndpointURL   string
	Status        string
	Attempts      int
	LastStatus    int
	LastError     string
	OccurredAt    time.Time
	LastAttemptAt *time.Time
	NextAttemptAt *time.Time
	DeliveredAt   *time.Time
}

// maxDeliveryRows bounds the delivery log page.
const maxDeliveryRows = 200

// DeliveryStatuses are the delivery statuses, in lifecycle order.
var DeliveryStatuses = []string{DeliveryPending, DeliveryDelivered, DeliveryFailed}

// Deliveries returns the newest deliveries (at most limit, ≤ 200) that acct may see: every
// tenant's for a global account, its own tenant's for a restricted one (docs/reference.md §5),
// only those in status when it is not "". Errors: ErrInvalidRequest (field status: not one of
// DeliveryStatuses), ErrStoreUnavailable.
func (w *Webhooks) Deliveries(ctx context.Context, acct *OperatorAccount, status string, limit int) ([]WebhookDelivery, error) {
	if acct == nil {
		return nil, errNotAdmin
	}
	if status != "" && status != DeliveryPending && status != DeliveryDelivered && status != DeliveryFailed {
		return nil, invalid(FieldError{Field: "status", Message: "must be pending, delivered or failed"})
	}
	if limit <= 0 || limit > maxDeliveryRows {
		limit = maxDeliveryRows
	}
	var rows []struct {
		models.WebhookEvent
		Tenant      string
		EndpointURL string
	}
	q := w.db.WithContext(ctx).Table("webhook_events AS e").
		Select("e.*, t.name AS tenant, w.url AS endpoint_url").
		Joins("JOIN webhook_endpoints w ON w.id = e.endpoint_id").
		Joins("JOIN tenants t ON t.id = e.tenant_id")
	if acct.TenantID != nil {
		q = q.Where("e.tenant_id = ?", *acct.TenantID)
	}
	if status != "" {
		q = q.Where("e.status = ?", status)
	}
	if err := q.Order("e.id DESC").Limit(limit).Scan(&rows).Error; err != nil {
		return nil, storeError("list webhook deliveries", err)
	}
	out := make([]WebhookDelivery, 0, len(rows))
	for _, r := range rows {
		d := WebhookDelivery{ID: r.ID, MsgID: r.MsgID, EventType: r.EventType, OperationID: r.OperationID,
			Tenant: r.Tenant, EndpointID: r.EndpointID, EndpointURL: r.EndpointURL, Status: r.Status,
			Attempts: r.Attempts, OccurredAt: r.OccurredAt.UTC(), LastAttemptAt: utcPtr(r.LastAttemptAt),
			DeliveredAt: utcPtr(r.DeliveredAt)}
		if r.LastStatus != nil {
			d.LastStatus = *r.LastStatus
		}
		if r.LastError != nil {
			d.LastError = *r.LastError
		}
		if r.Status == DeliveryPending {
			t := r.NextAttemptAt.UTC()
			d.NextAttemptAt = &t
		}
		out = append(out, d)
	}
	return out, nil
}

// TenantNames returns every tenant's name in order, for choosing an endpoint's tenant from a
// list (a typed name could create nothing, but a list avoids the typo). Errors:
// ErrStoreUnavailable.
func (w *Webhooks) TenantNames(ctx context.Context) ([]string, error) {
	var names []string
	if err := w.db.WithContext(ctx).Model(&models.Tenant{}).Order("name").Limit(maxAdminRows).Pluck("name", &names).Error; err != nil {
		return nil, storeError("list tenants", err)
	}
	return names, nil
}
