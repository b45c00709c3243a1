package vault

import (
	"time"

	"github.com/keybrake/keybrake/policy"
)

// ExposedObject is a money object a key counts, as an operator sees it
// (ListExposures, RefreshExposure, ReleaseExposure).
type ExposedObject struct {
	ObjectID string
	// Currency is the currency of the key's money on the object ("" when no
	// commit recorded one).
	Currency string
	Exposure
	// Windows are the cap windows the exposure is held on, with how much of it
	// each holds, in the order it was placed on them.
	Windows []WindowAmount
	// CreatedAt is when the key first counted the object; UpdatedAt when its
	// record last changed.
	CreatedAt time.Time
	UpdatedAt time.Time
}

// WindowAmount is money (minor units) on one cap window.
type WindowAmount struct {
	WindowID policy.WindowID
	Amount   int64
}

// ExposureChange is what an operator's refresh or release did to a money
// object: the object before and after, and the exposure it committed and
// released (minor units). Nothing changed when both are 0.
type ExposureChange struct {
	Before    ExposedObject
	After     ExposedObject
	Committed int64
	Released  int64
}

// StaleExposure is a money object with live exposure that nobody touched for
// a while (StaleExposures): its record did not change, and no refresher
// claimed it, since Touched.
type StaleExposure struct {
	KeyID    string
	ObjectID string
	Touched  time.Time
}
