// Package podtokens hands each pod's service-account token from the node's
// CSI driver to the node agent (docs/node-mode.md): the kubelet gives the
// driver the token of every pod that mounts its volume (CSIDriver
// tokenRequests, refreshed by requiresRepublish), the driver writes it with
// Write into a directory only the agent's uid can read, one file per pod
// named by the pod's UID, and removes it with Remove when the volume is
// unpublished; the agent reads it with Read. So a node holds the tokens of
// its own pods only, and the agent needs no right to create tokens.
//
// A file holds the kubelet's own JSON for one audience: {"token": ...,
// "expirationTimestamp": ...}. Files are written atomically (a temporary
// file created O_EXCL|O_NOFOLLOW in the directory held open, renamed over
// the name), 0600, owned by the directory's owner; they are read beneath
// the directory without following a link out of it. The package keeps no
// state.
package podtokens

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
	"time"

	"github.com/meshagent/meshagent/internal/files/atomicfile"
	"github.com/meshagent/meshagent/internal/files/regularfile"
)

// VolumeContextKey is the key of the volume context in which the kubelet
// passes a CSI driver the tokens its CSIDriver asks for: a JSON object of
// audience to Token.
const VolumeContextKey = "csi.storage.k8s.io/serviceAccount.tokens"

// PodUIDKey is the key of the volume context naming the pod (the CSIDriver's
// podInfoOnMount).
const PodUIDKey = "csi.storage.k8s.io/pod.uid"

// maxFile bounds a token file: a service-account token is a few KiB.
const maxFile = 64 << 10

// Token is one audience's token as the kubelet hands it over.
type Token struct {
	Token               string    `json:"token"`
	ExpirationTimestamp time.Time `json:"expirationTimestamp"`
}

// ErrNoToken is wrapped when a pod has no token file (its volume is not
// published, or the driver got no token for the audience).
var ErrNoToken = errors.New("no token handed over for the pod")

// FromVolumeContext returns the token for audience in a NodePublishVolume's
// volume context, and whether there is one.
func FromVolumeContext(volumeContext map[string]string, audience string) (Token, bool, error) {
	raw, ok := volumeContext[VolumeContextKey]
	if !ok {
		return Token{}, false, nil
	}
	var all map[string]Token
	if err := json.Unmarshal([]byte(raw), &all); err != nil {
		return Token{}, false, fmt.Errorf("%s: %w", VolumeContextKey, err)
	}
	tok, ok := all[audience]
	if !ok {
		return Token{}, false, nil
	}
	if err := tok.check(); err != nil {
		return Token{}, false, fmt.Errorf("%s[%q]: %w", VolumeContextKey, audience, err)
	}
	return tok, true, nil
}

func (t Token) check() error {
	switch {
	case t.Token == "":
		return errors.New("empty token")
	case len(t.Token) > maxFile/2:
		return fmt.Errorf("token of %d bytes", len(t.Token))
	case t.ExpirationTimestamp.IsZero():
		return errors.New("no expirationTimestamp")
	}
	for i := 0; i < len(t.Token); i++ {
		if c := t.Token[i]; c <= ' ' || c > '~' {
			return errors.New("token holds white space or control characters")
		}
	}
	return nil
}

// ValidPodUID reports whether uid has the shape of a pod UID (a lower-case
// UUID): the only names the directory holds.
func ValidPodUID(uid string) bool {
	if len(uid) != 36 {
		return false
	}
	for i := 0; i < len(uid); i++ {
		c := uid[i]
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if c != '-' {
				return false
			}
		} else if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Write replaces the token file of pod podUID in dir with tok, 0600, owned
// by the directory's owner (the agent's uid).
func Write(dir, podUID string, tok Token) error {
	if !ValidPodUID(podUID) {
		return fmt.Errorf("pod UID %q is not a UUID", podUID)
	}
	if err := tok.check(); err != nil {
		return err
	}
	data, err := json.Marshal(tok)
	if err != nil {
		return err
	}
	d, err := atomicfile.OpenDir(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	fi, err := d.File().Stat()
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner", dir)
	}
	p, err := d.Prepare(podUID, data, 0o600)
	if err != nil {
		return err
	}
	if err := p.SetOwner(int(st.Uid), int(st.Gid)); err != nil {
		p.Abort()
		return err
	}
	if err := p.Commit(); err != nil {
		return err
	}
	d.Sync()
	return nil
}

// Remove removes the token file of pod podUID from dir; a missing one is
// already removed.
func Remove(dir, podUID string) error {
	if !ValidPodUID(podUID) {
		return fmt.Errorf("pod UID %q is not a UUID", podUID)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.Remove(podUID); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Read returns the token of pod podUID from dir, or an error wrapping
// ErrNoToken when there is none.
func Read(dir, podUID string) (Token, error) {
	if !ValidPodUID(podUID) {
		return Token{}, fmt.Errorf("pod UID %q is not a UUID", podUID)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Token{}, err
	}
	defer root.Close()
	f, err := root.OpenFile(podUID, os.O_RDONLY|syscall.O_NOFOLLOW|regularfile.Flags, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return Token{}, fmt.Errorf("pod %s: %w", podUID, ErrNoToken)
	}
	if err != nil {
		return Token{}, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return Token{}, fmt.Errorf("token file of pod %s: %w", podUID, regularfile.ErrNotRegular)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxFile+1))
	if err != nil {
		return Token{}, err
	}
	if len(data) > maxFile {
		return Token{}, fmt.Errorf("token file of pod %s: %w", podUID, regularfile.ErrTooLarge)
	}
	var tok Token
	if err := json.Unmarshal(data, &tok); err != nil {
		return Token{}, fmt.Errorf("token file of pod %s: %w", podUID, err)
	}
	if err := tok.check(); err != nil {
		return Token{}, fmt.Errorf("token file of pod %s: %w", podUID, err)
	}
	return tok, nil
}
