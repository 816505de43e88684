package services

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
)

// Administration of API keys and operator accounts (docs/reference.md §5 "admin", issue 4).
//
// Every method here takes the acting account and requires a *global* admin: role admin and no
// tenant. A tenant-restricted admin is refused too, because API keys and operator accounts
// are installation-wide objects; letting a tenant's admin list or revoke them would leak other
// tenants' keys and let it create accounts outside its tenant.

// maxAdminRows bounds the admin listings; installations have few keys and accounts, and the
// bound keeps a mistaken bulk import from making the page unusable.
const maxAdminRows = 1000

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

// OperatorInfo is a dashboard account as the admin page shows it. Tenant is "" for a global
// account.
type OperatorInfo struct {
	ID        int64
	Username  string
	Role      string
	Tenant    string
	CreatedAt time.Time
}

// errNotAdmin refuses administration to anyone but a global admin.
var errNotAdmin = &Error{Code: CodeUnauthorized,
	Message: "Only a global admin account may manage API keys and operator accounts."}

// errLastAdmin keeps an installation administrable: without a global admin nobody could
// create accounts or revoke keys from the dashboard any more.
var errLastAdmin = &Error{Code: CodeInvalidRequest,
	Message: "This is the last global admin account: an installation must keep one. Make another account a global admin first."}

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

// ListAPIKeys returns the newest API keys first (at most 1000), revoked ones included.
// Errors: ErrUnauthorized unless acct is a global admin, ErrStoreUnavailable.
func (a *Auth) ListAPIKeys(ctx context.Context, acct *OperatorAccount) ([]APIKeyInfo, error) {
	if err := requireGlobalAdmin(acct); err != nil {
		return nil, err
	}
	var rows []struct {
		ID         int64
		Prefix     string
		Tenant     string
		Label      string
		CreatedAt  time.Time
		LastUsedAt *time.Time
		RevokedAt  *time.Time
	}
	err := a.db.WithContext(ctx).Table("api_keys AS k").
		Select("k.id, k.prefix, t.name AS tenant, k.label, k.created_at, k.last_used_at, k.revoked_at").
		Joins("JOIN tenants t ON t.id = k.tenant_id").
		Order("k.created_at DESC, k.id DESC").Limit(maxAdminRows).Scan(&rows).Error
	if err != nil {
		return nil, storeError("list API keys", err)
	}
	out := make([]APIKeyInfo, 0, len(rows))
	for _, r := range rows {
		out = append(out, APIKeyInfo{ID: r.ID, Prefix: r.Prefix, Tenant: r.Tenant, Label: r.Label,
			CreatedAt: r.CreatedAt.UTC(), LastUsedAt: utcPtr(r.LastUsedAt), RevokedAt: utcPtr(r.RevokedAt)})
	}
	return out, nil
}

// AdminCreateAPIKey is CreateAPIKey (generated secret) on behalf of acct. The returned secret
// is the only copy. Errors: ErrUnauthorized unless acct is a global admin, ErrInvalidRequest
// (including field tenant when the name differs from an existing tenant's only by letter case),
// ErrStoreUnavailable.
func (a *Auth) AdminCreateAPIKey(ctx context.Context, acct *OperatorAccount, tenant, label string) (string, error) {
	if err := requireGlobalAdmin(acct); err != nil {
		return "", err
	}
	// A new tenant whose name differs from an existing one only by letter case is almost
	// always a typo ("Shop" beside "shop"): refuse it and name the existing tenant.
	var near []models.Tenant
	if err := a.db.WithContext(ctx).Where("lower(name) = lower(?) AND name <> ?", tenant, tenant).Limit(1).
		Find(&near).Error; err != nil {
		return "", storeError("create API key", err)
	}
	if len(near) > 0 {
		return "", invalid(FieldError{Field: "tenant", Message: fmt.Sprintf(
			"differs from the existing tenant %q only by letter case; choose %q from the list, or a clearly different name",
			near[0].Name, near[0].Name)})
	}
	secret, err := a.CreateAPIKey(ctx, tenant, label, "")
	if err == nil {
		a.log.InfoContext(ctx, "API key created", "by", acct.Username, "tenant", tenant, "prefix", secretPrefix(secret))
	}
	return secret, err
}

// RevokeAPIKeyByID revokes the API key id. This process stops accepting it at once; other
// instances within CacheTTL. Errors: ErrUnauthorized unless acct is a global admin,
// ErrNotFound if there is no such key or it is revoked already, ErrStoreUnavailable.
func (a *Auth) RevokeAPIKeyByID(ctx context.Context, acct *OperatorAccount, id int64) error {
	if err := requireGlobalAdmin(acct); err != nil {
		return err
	}
	var k models.APIKey
	err := a.db.Tx(ctx, func(tx *gorm.DB) error {
		res := tx.Model(&models.APIKey{}).Where("id = ? AND revoked_at IS NULL", id).Update("revoked_at", time.Now().UTC())
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			return ErrNotFound
		}
		return tx.Select("id", "secret_hash", "prefix").Where("id = ?", id).Take(&k).Error
	})
	if err != nil {
		return storeError("revoke API key", err)
	}
	a.mu.Lock()
	delete(a.cache, k.SecretHash)
	a.gen++ // a lookup still in flight read the key before this: it must not cache it again
	a.mu.Unlock()
	a.log.InfoContext(ctx, "API key revoked", "by", acct.Username, "prefix", k.Prefix)
	return nil
}

// ListOperators returns the dashboard accounts by username (at most 1000). Errors:
// ErrUnauthorized unless acct is a global admin, ErrStoreUnavailable.
func (a *Auth) ListOperators(ctx context.Context, acct *OperatorAccount) ([]OperatorInfo, error) {
	if err := requireGlobalAdmin(acct); err != nil {
		return nil, err
	}
	var rows []struct {
		ID        int64
		Username  string
		Role      string
		Tenant    *string
		CreatedAt time.Time
	}
	err := a.db.WithContext(ctx).Table("operators AS o").
		Select("o.id, o.username, o.role, t.name AS tenant, o.created_at").
		Joins("LEFT JOIN tenants t ON t.id = o.tenant_id").
		Order("o.username").Limit(maxAdminRows).Scan(&rows).Error
	if err != nil {
		return nil, storeError("list operators", err)
	}
	out := make([]OperatorInfo, 0, len(rows))
	for _, r := range rows {
		info := OperatorInfo{ID: r.ID, Username: r.Username, Role: r.Role, CreatedAt: r.CreatedAt.UTC()}
		if r.Tenant != nil {
			info.Tenant = *r.Tenant
		}
		out = append(out, info)
	}
	return out, nil
}

// AdminCreateOperator is CreateOperator on behalf of acct. Errors: ErrUnauthorized unless
// acct is a global admin, and those of CreateOperator.
func (a *Auth) AdminCreateOperator(ctx context.Context, acct *OperatorAccount, username, password, role, tenant string) (*OperatorAccount, error) {
	if err := requireGlobalAdmin(acct); err != nil {
		return nil, err
	}
	op, err := a.CreateOperator(ctx, username, password, role, tenant)
	if err == nil {
		a.log.InfoContext(ctx, "operator created", "by", acct.Username, "username", op.Username, "role", op.Role)
	}
	return op, err
}

// SetOperatorRole changes account id's role. The dashboard reads the account on every
// request, so the change applies to its open sessions at their next request. Errors:
// ErrUnauthorized unless acct is a global admin, ErrInvalidRequest for an unknown role or for
// demoting the last global admin, ErrNotFound, ErrStoreUnavailable.
func (a *Auth) SetOperatorRole(ctx context.Context, acct *OperatorAccount, id int64, role string) error {
	if err := requireGlobalAdmin(acct); err != nil {
		return err
	}
	switch role {
	case RoleAdmin, RoleOperator, RoleAuditor:
	default:
		return invalid(FieldError{Field: "role", Message: "must be admin, operator or auditor"})
	}
	err := a.db.Tx(ctx, func(tx *gorm.DB) error {
		op, err := a.lockForAdminChange(tx, id)
		if err != nil {
			return err
		}
		if role != RoleAdmin {
			if err := a.keepsAnAdmin(tx, op); err != nil {
				return err
			}
		}
		return tx.Model(&models.Operator{}).Where("id = ?", id).Update("role", role).Error
	})
	if err != nil {
		return storeError("set operator role", err)
	}
	a.log.InfoContext(ctx, "operator role changed", "by", acct.Username, "operator_id", id, "role", role)
	return nil
}

// DeleteOperator deletes account id. Its open sessions end at their next request, because the
// dashboard reads the account on every request and treats a missing one as signed out.
// Errors: ErrUnauthorized unless acct is a global admin, ErrInvalidRequest for the last global
// admin, ErrNotFound, ErrStoreUnavailable.
func (a *Auth) DeleteOperator(ctx context.Context, acct *OperatorAccount, id int64) error {
	if err := requireGlobalAdmin(acct); err != nil {
		return err
	}
	err := a.db.Tx(ctx, func(tx *gorm.DB) error {
		op, err := a.lockForAdminChange(tx, id)
		if err != nil {
			return err
		}
		if err := a.keepsAnAdmin(tx, op); err != nil {
			return err
		}
		return tx.Where("id = ?", id).Delete(&models.Operator{}).Error
	})
	if err != nil {
		return storeError("delete operator", err)
	}
	a.log.InfoContext(ctx, "operator deleted", "by", acct.Username, "operator_id", id)
	return nil
}

// lockForAdminChange reads account id for a role change or deletion. It first locks every
// global admin row, so two admins demoting each other at once are serialised and the second
// sees the first's change (on SQLite the immediate transaction already is the lock).
func (a *Auth) lockForAdminChange(tx *gorm.DB, id int64) (*models.Operator, error) {
	var ids []int64
	if err := a.st.lock(tx.Model(&models.Operator{})).
		Where("role = ? AND tenant_id IS NULL", RoleAdmin).Pluck("id", &ids).Error; err != nil {
		return nil, err
	}
	var op models.Operator
	err := tx.Where("id = ?", id).Take(&op).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	return &op, err
}

// keepsAnAdmin refuses to take op away as a global admin when it is the last one.
func (a *Auth) keepsAnAdmin(tx *gorm.DB, op *models.Operator) error {
	if op.Role != RoleAdmin || op.TenantID != nil {
		return nil
	}
	var others int64
	if err := tx.Model(&models.Operator{}).Where("role = ? AND tenant_id IS NULL AND id <> ?", RoleAdmin, op.ID).
		Count(&others).Error; err != nil {
		return err
	}
	if others == 0 {
		return errLastAdmin
	}
	return nil
}
