package web

import (
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
)

// policyResponse is GET /v1/policy's body (docs/reference.md §2): what an acquire of operation
// in the caller's tenant takes for each field it leaves out, and which policy gives it
// (services.PolicySource*: "operation", "tenant" or "default"). ttl_seconds null: no policy
// gives a TTL, so acquires must send ttl_seconds; lease_seconds null: the lease is the TTL.
type policyResponse struct {
	Tenant       string  `json:"tenant"`
	Operation    *string `json:"operation"`
	TTLSeconds   *int64  `json:"ttl_seconds"`
	TTLFrom      string  `json:"ttl_from"`
	LeaseSeconds *int64  `json:"lease_seconds"`
	LeaseFrom    string  `json:"lease_from"`
	OnExpiry     string  `json:"on_expiry"`
	OnExpiryFrom string  `json:"on_expiry_from"`
	// RetentionSeconds is never null: without a policy it is the installation's retention.
	RetentionSeconds int64  `json:"retention_seconds"`
	RetentionFrom    string `json:"retention_from"`
	HorizonSeconds   *int64 `json:"horizon_seconds"`
	HorizonFrom      string `json:"horizon_from"`
}

// handlePolicy is GET /v1/policy?operation=NAME: the policy in force for an acquire of NAME
// (or of no operation name) in the caller's tenant, as this instance applies it.
func handlePolicy(ps *services.Policies) fiber.Handler {
	return func(c *fiber.Ctx) error {
		var op *string
		if name := c.Query("operation"); name != "" {
			if msg := services.ValidateOperationName(name); msg != "" {
				return fieldError("operation", msg)
			}
			op = &name
		}
		p := principal(c)
		pf, err := ps.InForce(c.UserContext(), p.TenantID, op)
		if err != nil {
			return err
		}
		return c.JSON(policyResponse{Tenant: p.TenantName, Operation: op, TTLSeconds: wholeSeconds(pf.TTL), TTLFrom: pf.TTLFrom,
			LeaseSeconds: wholeSeconds(pf.Lease), LeaseFrom: pf.LeaseFrom, OnExpiry: pf.OnExpiry, OnExpiryFrom: pf.OnExpiryFrom,
			RetentionSeconds: int64(pf.Retention / time.Second), RetentionFrom: pf.RetentionFrom,
			HorizonSeconds: wholeSeconds(pf.Horizon), HorizonFrom: pf.HorizonFrom})
	}
}

// wholeSeconds is d in seconds, nil for 0 (not set).
func wholeSeconds(d time.Duration) *int64 {
	if d <= 0 {
		return nil
	}
	s := int64(d / time.Second)
	return &s
}
