// Package webhooks delivers keybrake's events to operators' endpoints: it
// signs them as Standard Webhooks v1 says, refuses destinations on internal
// addresses, and runs the deliverer that drains the store's outbox.
package webhooks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The Standard Webhooks v1 headers.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
	secretPrefix    = "whsec_"
)

// Sign returns the webhook-signature header of body sent as message id at
// ts: "v1,<base64 HMAC-SHA256 of {id}.{unix ts}.{body}>" for each secret,
// space-separated. A secret is "whsec_" and the base64 of its key.
func Sign(secrets []string, id string, ts time.Time, body []byte) (string, error) {
	if len(secrets) == 0 {
		return "", fmt.Errorf("no secret to sign with")
	}
	sigs := make([]string, 0, len(secrets))
	for _, s := range secrets {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, secretPrefix))
		if err != nil {
			return "", fmt.Errorf("secret is not base64 after %s", secretPrefix)
		}
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id))
		mac.Write([]byte{'.'})
		mac.Write([]byte(strconv.FormatInt(ts.Unix(), 10)))
		mac.Write([]byte{'.'})
		mac.Write(body)
		sigs = append(sigs, "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	}
	return strings.Join(sigs, " "), nil
}
