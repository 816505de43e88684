package services

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/idemgate/idemgate/models"
	"golang.org/x/sync/singleflight"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Where a field of a PolicyInForce comes from, most specific first (docs/reference.md §2).
const (
	// PolicySourceOperation: the tenant's policy for this operation name.
	PolicySourceOperation = "operation"
	// PolicySourceTenant: the tenant's policy for every operation.
	PolicySourceTenant = "tenant"
	// PolicySourceDefault: no policy sets the field; the built-in default applies (no TTL: the
	// caller must send ttl_seconds; lease: the TTL; on_expiry: readmit).
	PolicySourceDefault = "default"
)

// PolicyMaxAge is how long an instance keeps a tenant's policies before it reads them again.
// A change made through another process (the CLI, another instance) applies to this instance's
// acquires within this time; one made through this instance applies at once. Policies change
// rarely and every acquire reads them, so reading them from the database per acquire would add
// a round trip to the hot path for nothing.
const PolicyMaxAge = 5 * time.Second

// PolicyInput is a policy to store (Policies.Set): Tenant by name, Operation "" for every
// operation of the tenant or one operation name. Nil fields are not set by the policy. All
// durations are whole seconds, at least 1 s. TTL and Lease are at most MaxTTLSeconds, Lease at
// most TTL; Retention and Horizon at most MaxRetention, Horizon at least Retention when both
// are set (docs/reference.md §2 "Lifecycle").
type PolicyInput struct {
	Tenant    string
	Operation string
	TTL       *time.Duration
	Lease     *time.Duration
	OnExpiry  *string
	Retention *time.Duration
	Horizon   *time.Duration
}

// MaxRetention bounds a policy's retention and horizon: 100 years, past any record-keeping
// rule, and far inside the database's timestamp range.
const MaxRetention = 100 * 365 * 24 * time.Hour

// PolicyInfo is a stored policy, as lists show it. Durations are whole seconds; nil is not set.
type PolicyInfo struct {
	Tenant    string
	Operation string // "" for every operation of the tenant
	TTL       *time.Duration
	Lease     *time.Duration
	OnExpiry  *string
	Retention *time.Duration
	Horizon   *time.Duration
	UpdatedAt time.Time
	UpdatedBy string
}

// PolicyInForce is what an acquire of one (tenant, operation) takes for the fields it leaves
// out, and the lifecycle its operation is admitted under: each field from the most specific
// policy that sets it (PolicySource*). TTL 0 means no policy gives one, so ttl_seconds is
// required. Lease 0 means the TTL. Retention defaults to IDEMGATE_RETENTION. Horizon 0 means
// none (the key is protected by its TTL alone); a horizon shorter than the retention in force
// is raised to it, since a key must not be freed while its evidence still answers for it.
type PolicyInForce struct {
	TTL           time.Duration
	TTLFrom       string
	Lease         time.Duration
	LeaseFrom     string
	OnExpiry      string
	OnExpiryFrom  string
	Retention     time.Duration
	RetentionFrom string
	Horizon       time.Duration
	HorizonFrom   string
}

// Policies stores the lifecycle policies of tenants and answers, through a cache of at most
// PolicyMaxAge, which one is in force for an acquire. One Policies serves a process: Admission
// reads through it, and a change made through it is seen by its acquires at once.
type Policies struct {
	db  *models.DB
	log *slog.Logger
	// retention is the retention when no policy gives one (IDEMGATE_RETENTION).
	retention time.Duration
	// maxTTL is the largest TTL an acquire gets (IDEMGATE_MAX_TTL): a policy's longer TTL is
	// cut to it, and InForce says so.
	maxTTL time.Duration
	mu     sync.Mutex
	cache  map[int64]*tenantPolicies
	// reads lets one read of a tenant's policies run at a time (tenant).
	reads singleflight.Group
}

// tenantPolicies is one tenant's policies as read at loaded, by operation name ("" for the
// tenant-wide one). Never changed once built.
type tenantPolicies struct {
	loaded time.Time
	byOp   map[string]models.Policy
}

// NewPolicies stores and reads policies in db; log receives changes (nil: nothing logged).
// Operations no policy gives a retention are kept DefaultRetention; see WithRetention.
func NewPolicies(db *models.DB, log *slog.Logger) *Policies {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Policies{db: db, log: log, retention: DefaultRetention, maxTTL: DefaultMaxTTL, cache: map[int64]*tenantPolicies{}}
}

// WithMaxTTL sets the largest TTL acquires get (IDEMGATE_MAX_TTL; 0 leaves DefaultMaxTTL;
// above MaxTTL it is cut to MaxTTL, as NewAdmission does) and returns ps.
func (ps *Policies) WithMaxTTL(d time.Duration) *Policies {
	if d > 0 {
		ps.maxTTL = min(d, MaxTTL)
	}
	return ps
}

// WithRetention sets the retention of operations no policy gives one (IDEMGATE_RETENTION; 0
// leaves DefaultRetention) and returns ps.
func (ps *Policies) WithRetention(d time.Duration) *Policies {
	if d > 0 {
		ps.retention = d
	}
	return ps
}

// Set stores in as the policy of its tenant and operation, replacing the one there was: fields
// not given are not set afterwards (the less specific policy or the default decides them).
// by is who changes it: a global admin's account, or Installation() for the command line
// (recorded as "cli"). Errors: CodeUnauthorized (by is not a global admin), ErrInvalidRequest (fields
// tenant, operation, ttl, lease, on_expiry, retention, horizon, and a policy that sets
// nothing), ErrStoreUnavailable.
func (ps *Policies) Set(ctx context.Context, by *OperatorAccount, in PolicyInput) (*PolicyInfo, error) {
	if mayCreateOrRevoke(by) != nil {
		return nil, errPolicyNotAdmin
	}
	actor := actorName(by)
	if err := in.validate(); err != nil {
		return nil, err
	}
	m := models.Policy{OperationName: in.Operation, TTLSeconds: seconds(in.TTL), LeaseSeconds: seconds(in.Lease),
		OnExpiry: in.OnExpiry, RetentionSeconds: seconds(in.Retention), HorizonSeconds: seconds(in.Horizon),
		UpdatedAt: time.Now().UTC(), UpdatedBy: actor}
	err := ps.db.Tx(ctx, func(tx *gorm.DB) error {
		id, err := tenantIDByName(tx, in.Tenant)
		if err != nil {
			return err
		}
		m.TenantID = id
		// One statement, so two admins setting the same policy at once both succeed (the
		// later wins) instead of one meeting the other's row in the unique index.
		return tx.Clauses(clause.OnConflict{
			Columns: []clause.Column{{Name: "tenant_id"}, {Name: "operation_name"}},
			DoUpdates: clause.AssignmentColumns([]string{"ttl_seconds", "lease_seconds", "on_expiry", "retention_seconds",
				"horizon_seconds", "updated_at", "updated_by"}),
		}).Create(&m).Error
	})
	if err != nil {
		return nil, storeError("set policy", err)
	}
	ps.forget(m.TenantID)
	ps.log.InfoContext(ctx, "policy set", "by", actor, "tenant", in.Tenant, "operation", in.Operation,
		"ttl_seconds", m.TTLSeconds, "lease_seconds", m.LeaseSeconds, "on_expiry", m.OnExpiry,
		"retention_seconds", m.RetentionSeconds, "horizon_seconds", m.HorizonSeconds)
	info := policyInfo(in.Tenant, m)
	return &info, nil
}

// errNoPolicy is Delete's ErrNotFound, saying what was not found.
var errNoPolicy = &Error{Code: CodeNotFound, Message: "There is no policy for this tenant and operation."}

// Delete removes the policy of tenant and operation ("" the tenant-wide one); by as for Set.
// Errors: CodeUnauthorized, ErrInvalidRequest (an unknown tenant), ErrNotFound (no such policy),
// ErrStoreUnavailable.
func (ps *Policies) Delete(ctx context.Context, by *OperatorAccount, tenant, operation string) error {
	if mayCreateOrRevoke(by) != nil {
		return errPolicyNotAdmin
	}
	actor := actorName(by)
	var tenantID int64
	err := ps.db.Tx(ctx, func(tx *gorm.DB) error {
		id, err := tenantIDByName(tx, tenant)
		if err != nil {
			return err
		}
		tenantID = id
		res := tx.Where("tenant_id = ? AND operation_name = ?", id, operation).Delete(&models.Policy{})
		if res.Error == nil && res.RowsAffected == 0 {
			return errNoPolicy
		}
		return res.Error
	})
	if err != nil {
		return storeError("delete policy", err)
	}
	ps.forget(tenantID)
	ps.log.InfoContext(ctx, "policy deleted", "by", actor, "tenant", tenant, "operation", operation)
	return nil
}

// List returns the policies of tenant (by name), or of every tenant when tenant is "", by
// tenant and operation name (the tenant-wide one first), at most maxAdminRows (1,000) like
// the other admin listings. Errors: ErrInvalidRequest (an unknown
// tenant), ErrStoreUnavailable.
func (ps *Policies) List(ctx context.Context, tenant string) ([]PolicyInfo, error) {
	var rows []struct {
		models.Policy
		Tenant string
	}
	q := ps.db.WithContext(ctx).Table("policies p").Select("p.*, t.name AS tenant").
		Joins("JOIN tenants t ON t.id = p.tenant_id").Order("t.name, p.operation_name").Limit(maxAdminRows)
	if tenant != "" {
		id, err := tenantIDByName(ps.db.WithContext(ctx), tenant)
		if err != nil {
			return nil, storeError("list policies", err)
		}
		q = q.Where("p.tenant_id = ?", id)
	}
	if err := q.Scan(&rows).Error; err != nil {
		return nil, storeError("list policies", err)
	}
	out := make([]PolicyInfo, len(rows))
	for i, r := range rows {
		out[i] = policyInfo(r.Tenant, r.Policy)
	}
	return out, nil
}

// InForce returns the policy in force for an acquire of operation (nil: none named) in tenantID,
// as this instance's acquires apply it (read through the cache): a TTL above the configured
// maximum is cut to it, and with a TTL the lease is never empty (the TTL when no policy gives
// one, a policy's cut to the TTL), so an acquire that leaves both out gets exactly these.
// Errors: ErrStoreUnavailable.
func (ps *Policies) InForce(ctx context.Context, tenantID int64, operation *string) (PolicyInForce, error) {
	tp, err := ps.tenant(ctx, tenantID)
	if err != nil {
		return PolicyInForce{}, storeError("read policies", err)
	}
	pf := tp.inForce(operation, ps.retention)
	if pf.TTL > ps.maxTTL {
		pf.TTL = ps.maxTTL.Truncate(time.Second)
	}
	if pf.TTL > 0 && (pf.Lease == 0 || pf.Lease > pf.TTL) {
		pf.Lease = pf.TTL
	}
	return pf, nil
}

// lifecycle is the retention and horizon an operation is admitted under, in whole seconds,
// stored on it by the acquire: retention 0 when no policy gives one (the installation's
// IDEMGATE_RETENTION, applied when the reaper purges), horizon 0 for none.
type lifecycle struct {
	retention, horizon int64
}

// applyTo fills in the fields in leaves out from the policy in force for its operation in
// tenantID (ttl_seconds when 0, lease_seconds and on_expiry when nil) and returns the
// lifecycle the operation is admitted under. A policy's TTL above ceiling (the configured
// maximum, in seconds) is cut to it, and its lease to the request's TTL, so a policy never
// turns a valid request into an invalid one.
func (ps *Policies) applyTo(ctx context.Context, tenantID int64, in *AcquireInput, ceiling int64) (lifecycle, error) {
	tp, err := ps.tenant(ctx, tenantID)
	if err != nil {
		return lifecycle{}, err
	}
	if len(tp.byOp) == 0 {
		return lifecycle{}, nil
	}
	pf := tp.inForce(in.Operation, ps.retention)
	if in.TTLSeconds == 0 && pf.TTL > 0 {
		in.TTLSeconds = min(int64(pf.TTL/time.Second), ceiling)
	}
	if in.LeaseSeconds == nil && pf.Lease > 0 && in.TTLSeconds > 0 {
		lease := min(int64(pf.Lease/time.Second), in.TTLSeconds)
		in.LeaseSeconds = &lease
	}
	if in.OnExpiry == nil && pf.OnExpiryFrom != PolicySourceDefault {
		onExpiry := pf.OnExpiry
		in.OnExpiry = &onExpiry
	}
	life := lifecycle{horizon: int64(pf.Horizon / time.Second)}
	if pf.RetentionFrom != PolicySourceDefault {
		// The installation's retention is not stored: the reaper applies IDEMGATE_RETENTION as
		// it is when it purges, so the setting stays one knob for every operation without a
		// policy.
		life.retention = int64(pf.Retention / time.Second)
	}
	return life, nil
}

// tenant returns tenantID's policies, read again when older than PolicyMaxAge. Should that
// read fail, the policies read before are used, and with none the database's error is
// returned (the caller classifies it): an acquire must not run under defaults its tenant
// changed.
func (ps *Policies) tenant(ctx context.Context, tenantID int64) (*tenantPolicies, error) {
	ps.mu.Lock()
	tp := ps.cache[tenantID]
	ps.mu.Unlock()
	if tp != nil && time.Since(tp.loaded) < PolicyMaxAge {
		return tp, nil
	}
	// One read per tenant at a time: when the entry goes stale under load, every acquire of
	// the tenant in flight would otherwise read the policies at once. The read is not the
	// first caller's to cancel (the others wait on it), so it runs under the store timeout.
	v, err, _ := ps.reads.Do(strconv.FormatInt(tenantID, 10), func() (any, error) {
		rctx, cancel := ps.db.Bounded(context.WithoutCancel(ctx))
		defer cancel()
		var rows []models.Policy
		if err := ps.db.WithContext(rctx).Where("tenant_id = ?", tenantID).Find(&rows).Error; err != nil {
			return nil, err
		}
		fresh := &tenantPolicies{loaded: time.Now(), byOp: make(map[string]models.Policy, len(rows))}
		for _, r := range rows {
			fresh.byOp[r.OperationName] = r
		}
		ps.mu.Lock()
		ps.cache[tenantID] = fresh
		ps.mu.Unlock()
		return fresh, nil
	})
	if err != nil {
		if tp != nil {
			ps.log.WarnContext(ctx, "policies not read again; using those read before", "tenant_id", tenantID, "err", err)
			return tp, nil
		}
		return nil, err
	}
	return v.(*tenantPolicies), nil
}

// forget drops tenantID's cached policies, so this instance's next acquire reads them again.
func (ps *Policies) forget(tenantID int64) {
	ps.mu.Lock()
	delete(ps.cache, tenantID)
	ps.mu.Unlock()
}

// inForce merges tp's policies for operation field by field, most specific first; retention
// is the retention when none gives one.
func (tp *tenantPolicies) inForce(operation *string, retention time.Duration) PolicyInForce {
	pf := PolicyInForce{TTLFrom: PolicySourceDefault, LeaseFrom: PolicySourceDefault,
		OnExpiry: OnExpiryReadmit, OnExpiryFrom: PolicySourceDefault,
		Retention: retention, RetentionFrom: PolicySourceDefault, HorizonFrom: PolicySourceDefault}
	var layers []models.Policy
	var sources []string
	if operation != nil && *operation != "" {
		if p, ok := tp.byOp[*operation]; ok {
			layers, sources = append(layers, p), append(sources, PolicySourceOperation)
		}
	}
	if p, ok := tp.byOp[""]; ok {
		layers, sources = append(layers, p), append(sources, PolicySourceTenant)
	}
	for i := len(layers) - 1; i >= 0; i-- { // least specific first, so the most specific wins
		p := layers[i]
		if p.TTLSeconds != nil {
			pf.TTL, pf.TTLFrom = time.Duration(*p.TTLSeconds)*time.Second, sources[i]
		}
		if p.LeaseSeconds != nil {
			pf.Lease, pf.LeaseFrom = time.Duration(*p.LeaseSeconds)*time.Second, sources[i]
		}
		if p.OnExpiry != nil {
			pf.OnExpiry, pf.OnExpiryFrom = *p.OnExpiry, sources[i]
		}
		if p.RetentionSeconds != nil {
			pf.Retention, pf.RetentionFrom = time.Duration(*p.RetentionSeconds)*time.Second, sources[i]
		}
		if p.HorizonSeconds != nil {
			pf.Horizon, pf.HorizonFrom = time.Duration(*p.HorizonSeconds)*time.Second, sources[i]
		}
	}
	if pf.Horizon > 0 && pf.Horizon < pf.Retention {
		pf.Horizon = pf.Retention
	}
	return pf
}

func (in *PolicyInput) validate() error {
	var fe []FieldError
	add := func(field, msg string) {
		if msg != "" {
			fe = append(fe, FieldError{Field: field, Message: msg})
		}
	}
	add("tenant", ValidateTenantName(in.Tenant))
	if in.Operation != "" {
		add("operation", ValidateOperationName(in.Operation))
	}
	add("ttl", validatePolicyDuration(in.TTL))
	add("lease", validatePolicyDuration(in.Lease))
	if in.TTL != nil && in.Lease != nil && *in.Lease > *in.TTL {
		add("lease", "must not be longer than ttl")
	}
	if in.OnExpiry != nil && *in.OnExpiry != OnExpiryReadmit && *in.OnExpiry != OnExpiryHold {
		add("on_expiry", "must be readmit or hold_until_reconciled")
	}
	add("retention", validateLifecycleDuration(in.Retention))
	add("horizon", validateLifecycleDuration(in.Horizon))
	if in.Retention != nil && in.Horizon != nil && *in.Horizon < *in.Retention {
		add("horizon", "must not be shorter than retention: a key must not be freed while its evidence is kept")
	}
	if in.TTL == nil && in.Lease == nil && in.OnExpiry == nil && in.Retention == nil && in.Horizon == nil && len(fe) == 0 {
		add("policy", "sets nothing: give at least one of ttl, lease, on_expiry, retention, horizon")
	}
	if len(fe) > 0 {
		return invalid(fe...)
	}
	return nil
}

// validatePolicyDuration checks a policy's TTL or lease: whole seconds from 1 s to
// MaxTTLSeconds (an acquire's ttl_seconds range).
func validatePolicyDuration(d *time.Duration) string {
	if d == nil {
		return ""
	}
	if *d < time.Second || *d%time.Second != 0 || *d/time.Second > MaxTTLSeconds {
		return fmt.Sprintf("must be whole seconds from 1s to %ds", int64(MaxTTLSeconds))
	}
	return ""
}

// validateLifecycleDuration checks a policy's retention or horizon: whole seconds from 1 s
// (so tests can run) to MaxRetention.
func validateLifecycleDuration(d *time.Duration) string {
	if d == nil {
		return ""
	}
	if *d < time.Second || *d%time.Second != 0 || *d > MaxRetention {
		return "must be whole seconds from 1s to 100 years"
	}
	return ""
}

// errPolicyNotAdmin refuses a policy change to anyone but a global admin (or the
// installation): a policy decides how long every key of a tenant is protected.
var errPolicyNotAdmin = &Error{Code: CodeUnauthorized, Message: "Only a global admin account may change policies."}

// actorName is how a change by by is recorded: the account's username, "cli" for the
// installation (the command line).
func actorName(by *OperatorAccount) string {
	if by == installation {
		return "cli"
	}
	return by.Username
}

// tenantIDByName is the id of the tenant named name. Errors: errNoSuchTenant, or the query's.
func tenantIDByName(db *gorm.DB, name string) (int64, error) {
	var t models.Tenant
	if err := db.Where("name = ?", name).Take(&t).Error; errors.Is(err, gorm.ErrRecordNotFound) {
		return 0, errNoSuchTenant(name)
	} else if err != nil {
		return 0, err
	}
	return t.ID, nil
}

func seconds(d *time.Duration) *int64 {
	if d == nil {
		return nil
	}
	s := int64(*d / time.Second)
	return &s
}

func duration(s *int64) *time.Duration {
	if s == nil {
		return nil
	}
	d := time.Duration(*s) * time.Second
	return &d
}

func policyInfo(tenant string, m models.Policy) PolicyInfo {
	return PolicyInfo{Tenant: tenant, Operation: m.OperationName, TTL: duration(m.TTLSeconds), Lease: duration(m.LeaseSeconds),
		OnExpiry: m.OnExpiry, Retention: duration(m.RetentionSeconds), Horizon: duration(m.HorizonSeconds),
		UpdatedAt: m.UpdatedAt, UpdatedBy: m.UpdatedBy}
}

// args is l as the acquire statements' arguments: the retention in seconds, nil when unknown
// (kept for IDEMGATE_RETENTION, as before lifecycles), and the horizon in seconds or nil for
// none.
func (l lifecycle) args() (retention, horizon *int64) {
	if l.retention > 0 {
		r := l.retention
		retention = &r
	}
	if l.horizon > 0 {
		h := l.horizon
		horizon = &h
	}
	return retention, horizon
}
