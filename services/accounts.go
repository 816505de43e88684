package services

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Accounts administers the installation: API keys and tenants (this file), dashboard accounts
// (operators.go), and the first start's Bootstrap (docs/reference.md §5 "admin", §7).
//
// Every method but Bootstrap takes the acting account, by. Most require a *global* admin:
// role admin and no tenant. A tenant-restricted admin is refused too, because API keys and
// operator accounts are installation-wide objects; letting a tenant's admin list or revoke
// them would leak other tenants' keys and let it create accounts outside its tenant. What an
// account changes is logged with its username ("by").
//
// Bootstrap and the command line's `apikey create`, `apikey revoke` and `operator create` act
// as Installation(), the installation itself (whoever runs them holds the database's
// credentials): nothing is checked or logged for it. It is a value of its own, not nil, so a
// caller that lost its account (nil) is refused like any other non-admin: the HTTP layer
// passes the signed-in account, and can never pass the installation by mistake.
//
// Safe for concurrent use.
type Accounts struct {
	db  *models.DB
	st  store
	log *slog.Logger
	// auth, when not nil, is told of revocations (Auth.forget), so that it refuses a revoked
	// key at once rather than within CacheTTL.
	auth *Auth
}

// NewAccounts returns an Accounts over db. log may be nil (nothing is logged). auth is the
// Auth of the same process, whose cache then forgets a key revoked here at once; nil when this
// process authenticates nothing (the command line).
func NewAccounts(db *models.DB, log *slog.Logger, auth *Auth) *Accounts {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Accounts{db: db, st: newStore(db), log: log, auth: auth}
}

// maxAdminRows bounds the admin listings; installations have few keys and accounts, and the
// bound keeps a mistaken bulk import from making the page unusable.
const maxAdminRows = 1000

// errNotAdmin refuses administration to anyone but a global admin.
var errNotAdmin = &Error{Code: CodeUnauthorized,
	Message: "Only a global admin account may manage API keys and operator accounts."}

// IsGlobalAdmin reports whether acct may administer the installation: role admin and not
// restricted to a tenant.
func IsGlobalAdmin(acct *OperatorAccount) bool {
	return acct != nil && acct.Role == RoleAdmin && acct.TenantID == nil
}

func requireGlobalAdmin(acct *OperatorAccount) error {
	if !IsGlobalAdmin(acct) {
		return errNotAdmin
	}
	return nil
}

// installation is Installation()'s value; methods compare by against this pointer.
var installation = &OperatorAccount{Username: "installation", Role: RoleAdmin}

// Installation returns the acting account of the installation itself, for Bootstrap and the
// command line (see Accounts). It passes every check of Accounts, and what it does is not
// logged as an account's act.
func Installation() *OperatorAccount { return installation }

// mayCreateOrRevoke is the check of the methods the installation also calls: the installation
// may, an account only when it is a global admin, and nil (no account) never.
func mayCreateOrRevoke(by *OperatorAccount) error {
	if by == installation {
		return nil
	}
	return requireGlobalAdmin(by)
}

// BootstrapResult reports the secrets Bootstrap generated. A field is "" when nothing was
// generated (an account or key already existed, or the secret was supplied).
type BootstrapResult struct {
	AdminCreated  bool
	AdminPassword string // generated admin password, shown once
	APIKeyCreated bool
	APIKey        string // generated default-tenant API key, shown once
	// APIKeyIgnored: an API key was supplied, but API keys existed already, so it was not
	// stored and does not authenticate (it only seeds an empty database).
	APIKeyIgnored bool
}

// DefaultTenant is the tenant of the bootstrap API key (docs/reference.md §7).
const DefaultTenant = "default"

// Bootstrap creates an "admin" operator if there is no operator yet and a "default"-tenant API
// key if there is no API key yet (docs/reference.md §7), acting as the installation. adminPassword
// and apiKey are used when not empty, otherwise secrets are generated and returned for printing
// once. Concurrent first starts of several instances may each try; the unique username keeps
// one admin, and a second default key is harmless. Errors: ErrInvalidRequest for a supplied
// secret that is too weak or malformed.
func (ac *Accounts) Bootstrap(ctx context.Context, adminPassword, apiKey string) (*BootstrapResult, error) {
	res := &BootstrapResult{}
	db := ac.db.WithContext(ctx)
	var n int64
	if err := db.Model(&models.Operator{}).Count(&n).Error; err != nil {
		return nil, storeError("bootstrap", err)
	}
	if n == 0 {
		pw := adminPassword
		if pw == "" {
			pw = newSecret("")[:24]
			res.AdminPassword = pw
		}
		_, err := ac.CreateOperator(ctx, installation, "admin", pw, RoleAdmin, "")
		if err != nil && !isTaken(err) {
			return nil, fmt.Errorf("bootstrap admin (IDEMGATE_ADMIN_PASSWORD): %w", err)
		}
		res.AdminCreated = err == nil
		if !res.AdminCreated {
			res.AdminPassword = ""
		}
	}
	if err := db.Model(&models.APIKey{}).Count(&n).Error; err != nil {
		return nil, storeError("bootstrap", err)
	}
	if n > 0 && apiKey != "" {
		// Storing it on a later start would let whoever edits the environment mint a key; but
		// unless said, the caller who set it gets 401s with no hint why.
		res.APIKeyIgnored = true
	}
	if n == 0 {
		secret, err := ac.CreateAPIKey(ctx, installation, DefaultTenant, "bootstrap", apiKey)
		if errors.Is(err, gorm.ErrDuplicatedKey) {
			return res, nil // another instance stored the same supplied key first
		}
		if err != nil {
			return nil, fmt.Errorf("bootstrap API key (IDEMGATE_BOOTSTRAP_API_KEY): %w", err)
		}
		res.APIKeyCreated = true
		if apiKey == "" {
			res.APIKey = secret
		}
	}
	return res, nil
}

var apiKeyPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{24,128}$`)

// ValidateAPIKeySecret checks a caller-supplied API key (IDEMGATE_BOOTSTRAP_API_KEY): 24–128
// characters of [A-Za-z0-9_-] (docs/reference.md §7). It returns "" when valid.
func ValidateAPIKeySecret(s string) string {
	if !apiKeyPattern.MatchString(s) {
		return "must be 24 to 128 characters of A-Z, a-z, 0-9, '_' and '-'"
	}
	return ""
}

// ValidateTenantName checks a tenant name: 1–64 characters of [A-Za-z0-9._:-].
func ValidateTenantName(s string) string { return ValidateOperationName(s) }

// CreateAPIKey creates an API key for tenant (created if new) and returns its secret, the only
// copy. secret may be "" to generate one (256 random bits); a supplied one must pass
// ValidateAPIKeySecret. by is the acting account, Installation() for the installation (see Accounts). An
// account must be a global admin and may not create a new tenant whose name differs from an
// existing tenant's only by letter case, almost always a typo in a form ("Shop" beside "shop");
// its key is logged with its prefix. Errors: ErrUnauthorized, ErrInvalidRequest (fields tenant,
// label, api_key), ErrStoreUnavailable.
func (ac *Accounts) CreateAPIKey(ctx context.Context, by *OperatorAccount, tenant, label, secret string) (string, error) {
	if err := mayCreateOrRevoke(by); err != nil {
		return "", err
	}
	if by != installation {
		if err := ac.refuseNearTenant(ctx, tenant); err != nil {
			return "", err
		}
	}
	if msg := ValidateTenantName(tenant); msg != "" {
		return "", invalid(FieldError{Field: "tenant", Message: msg})
	}
	if msg := validateText(label, 200, true); msg != "" {
		return "", invalid(FieldError{Field: "label", Message: msg})
	}
	if secret == "" {
		secret = newSecret(apiKeyPrefix)
	} else if msg := ValidateAPIKeySecret(secret); msg != "" {
		return "", invalid(FieldError{Field: "api_key", Message: msg})
	}
	err := ac.db.Tx(ctx, func(tx *gorm.DB) error {
		t, err := ensureTenant(tx, tenant)
		if err != nil {
			return err
		}
		return tx.Create(&models.APIKey{TenantID: t.ID, Prefix: secretPrefix(secret), SecretHash: hashSecret(secret),
			Label: label, CreatedAt: time.Now().UTC()}).Error
	})
	if err != nil {
		return "", storeError("create API key", err)
	}
	if by != installation {
		ac.log.InfoContext(ctx, "API key created", "by", by.Username, "tenant", tenant, "prefix", secretPrefix(secret))
	}
	return secret, nil
}

// refuseNearTenant refuses, as field tenant, a new tenant name that differs from an existing
// tenant's only by letter case, naming the existing one.
func (ac *Accounts) refuseNearTenant(ctx context.Context, tenant string) error {
	var near []models.Tenant
	if err := ac.db.WithContext(ctx).Where("lower(name) = lower(?) AND name <> ?", tenant, tenant).Limit(1).
		Find(&near).Error; err != nil {
		return storeError("create API key", err)
	}
	if len(near) > 0 {
		return invalid(FieldError{Field: "tenant", Message: fmt.Sprintf(
			"differs from the existing tenant %q only by letter case; choose %q from the list, or a clearly different name",
			near[0].Name, near[0].Name)})
	}
	return nil
}

// secretPrefix is the part of a secret shown to operators: enough to tell keys apart, far too
// little to guess the rest.
func secretPrefix(secret string) string {
	if len(secret) > 12 {
		return secret[:12]
	}
	return secret[:len(secret)/2]
}

func ensureTenant(tx *gorm.DB, name string) (*models.Tenant, error) {
	// Insert-or-nothing, then read: two instances bootstrapping at once both end up with the
	// one tenant row instead of one failing on the unique name.
	if err := tx.Clauses(clause.OnConflict{DoNothing: true}).
		Create(&models.Tenant{Name: name, CreatedAt: time.Now().UTC()}).Error; err != nil {
		return nil, err
	}
	var t models.Tenant
	err := tx.Where("name = ?", name).Take(&t).Error
	return &t, err
}

// APIKeyRef names the API keys RevokeAPIKey revokes: ID, one key by its id (the admin page's
// way), or when ID is 0, Key, every key whose secret or display prefix it is, surrounding
// spaces ignored (the command line's way).
type APIKeyRef struct {
	ID  int64
	Key string
}

// RevokeAPIKey revokes the unrevoked API keys ref names and returns how many it revoked. The
// Auth given to NewAccounts refuses them at once; other processes within CacheTTL. by is the
// acting account, Installation() for the installation (see Accounts); an account must be a global admin,
// and each key it revokes is logged with its prefix. Errors: ErrUnauthorized, ErrNotFound (no
// unrevoked key matches: none does, or it is revoked already), ErrStoreUnavailable.
func (ac *Accounts) RevokeAPIKey(ctx context.Context, by *OperatorAccount, ref APIKeyRef) (int64, error) {
	if err := mayCreateOrRevoke(by); err != nil {
		return 0, err
	}
	where, args := "id = ?", []any{ref.ID}
	if ref.ID == 0 {
		key := strings.TrimSpace(ref.Key)
		if key == "" {
			return 0, ErrNotFound
		}
		where, args = "secret_hash = ? OR prefix = ?", []any{hashSecret(key), key}
	}
	var keys []models.APIKey
	var revoked int64
	err := ac.db.Tx(ctx, func(tx *gorm.DB) error {
		if err := tx.Select("id", "secret_hash", "prefix").Where("revoked_at IS NULL AND ("+where+")", args...).
			Find(&keys).Error; err != nil {
			return err
		}
		ids := make([]int64, 0, len(keys))
		for _, k := range keys {
			ids = append(ids, k.ID)
		}
		if len(ids) > 0 {
			res := tx.Model(&models.APIKey{}).Where("id IN ? AND revoked_at IS NULL", ids).Update("revoked_at", time.Now().UTC())
			if res.Error != nil {
				return res.Error
			}
			revoked = res.RowsAffected
		}
		if revoked == 0 {
			return ErrNotFound
		}
		return nil
	})
	if err != nil {
		return 0, storeError("revoke API key", err)
	}
	if ac.auth != nil {
		hashes := make([]string, 0, len(keys))
		for _, k := range keys {
			hashes = append(hashes, k.SecretHash)
		}
		ac.auth.forget(hashes...)
	}
	if by != installation {
		for _, k := range keys {
			ac.log.InfoContext(ctx, "API key revoked", "by", by.Username, "prefix", k.Prefix)
		}
	}
	return revoked, nil
}

// APIKeyInfo is an API key as the admin page shows it. It never carries the secret or its
// hash: the secret exists only in the answer to its creation.
type APIKeyInfo struct {
	ID         int64
	Prefix     string
	Tenant     string
	Label      string
	CreatedAt  time.Time
	LastUsedAt *time.Time
	RevokedAt  *time.Time
}

// ListAPIKeys returns the newest API keys first (at most 1000), revoked ones included.
// Errors: ErrUnauthorized unless by is a global admin, ErrStoreUnavailable.
func (ac *Accounts) ListAPIKeys(ctx context.Context, by *OperatorAccount) ([]APIKeyInfo, error) {
	if err := requireGlobalAdmin(by); err != nil {
		return nil, err
	}
	var out []APIKeyInfo
	err := ac.db.WithContext(ctx).Table("api_keys AS k").
		Select("k.id, k.prefix, t.name AS tenant, k.label, k.created_at, k.last_used_at, k.revoked_at").
		Joins("JOIN tenants t ON t.id = k.tenant_id").
		Order("k.created_at DESC, k.id DESC").Limit(maxAdminRows).Scan(&out).Error
	if err != nil {
		return nil, storeError("list API keys", err)
	}
	for i := range out {
		out[i].CreatedAt, out[i].LastUsedAt, out[i].RevokedAt = out[i].CreatedAt.UTC(), utcPtr(out[i].LastUsedAt), utcPtr(out[i].RevokedAt)
	}
	return out, nil
}

// TenantInfo is a tenant as `idemgate tenant list` shows it: its API keys counted, never
// listed.
type TenantInfo struct {
	Name       string
	CreatedAt  time.Time
	APIKeys    int64 // every API key of the tenant, revoked ones included
	ActiveKeys int64 // API keys not revoked
}

// ListTenants returns every tenant by name (at most 1000) with its API key counts. Errors:
// ErrUnauthorized unless by is a global admin, ErrStoreUnavailable.
func (ac *Accounts) ListTenants(ctx context.Context, by *OperatorAccount) ([]TenantInfo, error) {
	if err := requireGlobalAdmin(by); err != nil {
		return nil, err
	}
	var rows []struct {
		Name       string
		CreatedAt  time.Time
		APIKeys    int64
		ActiveKeys int64
	}
	err := ac.db.WithContext(ctx).Table("tenants AS t").
		Select("t.name, t.created_at, COUNT(k.id) AS api_keys, " +
			"COALESCE(SUM(CASE WHEN k.id IS NOT NULL AND k.revoked_at IS NULL THEN 1 ELSE 0 END), 0) AS active_keys").
		Joins("LEFT JOIN api_keys k ON k.tenant_id = t.id").
		Group("t.id, t.name, t.created_at").Order("t.name").Limit(maxAdminRows).Scan(&rows).Error
	if err != nil {
		return nil, storeError("list tenants", err)
	}
	out := make([]TenantInfo, 0, len(rows))
	for _, r := range rows {
		out = append(out, TenantInfo{Name: r.Name, CreatedAt: r.CreatedAt.UTC(), APIKeys: r.APIKeys, ActiveKeys: r.ActiveKeys})
	}
	return out, nil
}
