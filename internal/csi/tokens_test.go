package csi

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/meshagent/meshagent/internal/node/podtokens"
)

const (
	podUID   = "5b1c3f7e-2d4a-4c8e-9f01-23456789abcd"
	audience = "identity.l5d.io"
)

// tokenReq is publishReq with the kubelet's pod UID and its tokens (the
// CSIDriver's podInfoOnMount and tokenRequests), as JSON of audience to
// token.
func tokenReq(t *testing.T, target, uid string, tokens map[string]podtokens.Token) *csipb.NodePublishVolumeRequest {
	t.Helper()
	req := publishReq(target)
	b, err := json.Marshal(tokens)
	if err != nil {
		t.Fatal(err)
	}
	req.VolumeContext[podtokens.VolumeContextKey] = string(b)
	req.VolumeContext[podtokens.PodUIDKey] = uid
	return req
}

func (n node) tokenDriver(t *testing.T) (*Driver, string) {
	t.Helper()
	dir := filepath.Join(filepath.Dir(n.pods), "tokens")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// The agent's uid owns the directory; the driver gives it the files.
	if err := os.Chown(dir, 1337, 1337); err != nil {
		t.Fatal(err)
	}
	d, err := NewDriver(DriverConfig{NodeID: "node-1", SocketDir: n.socketDir, TargetRoot: n.pods, TokenDir: dir, TokenAudience: audience})
	if err != nil {
		t.Fatal(err)
	}
	return d, dir
}

// Publishing hands the pod's token for the audience over, 0600 and owned by
// the token directory's owner, under the pod's UID; a republish (the
// kubelet's refresh) replaces it; unpublishing removes it. Tokens of other
// audiences are not written.
func TestPublishHandsThePodTokenOver(t *testing.T) {
	n := newNode(t)
	d, dir := n.tokenDriver(t)
	target := n.target(t, podUID)
	exp := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	first := podtokens.Token{Token: "first.jwt.token", ExpirationTimestamp: exp}
	if _, err := d.NodePublishVolume(context.Background(), tokenReq(t, target, podUID, map[string]podtokens.Token{
		audience: first, "istio-ca": {Token: "other.jwt", ExpirationTimestamp: exp},
	})); err != nil {
		t.Fatal(err)
	}
	got, err := podtokens.Read(dir, podUID)
	if err != nil || got.Token != first.Token || !got.ExpirationTimestamp.Equal(exp) {
		t.Fatalf("token handed over: %+v, %v; want %+v", got, err, first)
	}
	fi, err := os.Lstat(filepath.Join(dir, podUID))
	if err != nil {
		t.Fatal(err)
	}
	if st := fileOwner(fi); fi.Mode().Perm() != 0o600 || st != [2]uint32{1337, 1337} {
		t.Errorf("token file mode %v owner %v, want 0600 owned by the directory's owner 1337:1337", fi.Mode().Perm(), st)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("token directory holds %d entries, want the pod's file alone", len(entries))
	}

	// The kubelet republishes with a fresh token: it replaces the old one
	// (the volume is already mounted: nothing else changes).
	second := podtokens.Token{Token: "second.jwt.token", ExpirationTimestamp: exp.Add(time.Hour)}
	if _, err := d.NodePublishVolume(context.Background(), tokenReq(t, target, podUID, map[string]podtokens.Token{audience: second})); err != nil {
		t.Fatal(err)
	}
	if got, err := podtokens.Read(dir, podUID); err != nil || got.Token != second.Token {
		t.Fatalf("after the republish: %+v, %v; want the second token", got, err)
	}
	if m := mustMounts(t, target); len(m) != 1 {
		t.Errorf("%d mounts after the republish, want 1", len(m))
	}

	if _, err := d.NodeUnpublishVolume(context.Background(), &csipb.NodeUnpublishVolumeRequest{VolumeId: "csi-0123", TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := podtokens.Read(dir, podUID); !errors.Is(err, podtokens.ErrNoToken) {
		t.Errorf("after the unpublish: %v, want no token", err)
	}
}

// What the driver refuses to hand over: a volume context naming another pod
// than the target path's, a malformed tokens value, a target outside a pod
// directory. Nothing is written.
func TestPublishRefusesAMisnamedToken(t *testing.T) {
	n := newNode(t)
	d, dir := n.tokenDriver(t)
	exp := time.Now().Add(time.Hour)
	good := map[string]podtokens.Token{audience: {Token: "a.b.c", ExpirationTimestamp: exp}}
	other := "00000000-1111-4222-8333-444444444444"
	for name, req := range map[string]*csipb.NodePublishVolumeRequest{
		"another pod's UID": tokenReq(t, n.target(t, podUID), other, good),
		"bad JSON": func() *csipb.NodePublishVolumeRequest {
			r := tokenReq(t, n.target(t, podUID), podUID, good)
			r.VolumeContext[podtokens.VolumeContextKey] = "{not json"
			return r
		}(),
		"token with a newline": tokenReq(t, n.target(t, podUID), podUID, map[string]podtokens.Token{audience: {Token: "a\nb", ExpirationTimestamp: exp}}),
		"not a pod directory":  tokenReq(t, n.target(t, "not-a-uid"), podUID, good),
	} {
		_, err := d.NodePublishVolume(context.Background(), req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("token directory holds %v after refusals", entries)
	}
	// Without a token for the audience the volume is published all the
	// same: the socket is what every pod gets.
	if _, err := d.NodePublishVolume(context.Background(), tokenReq(t, n.target(t, podUID), podUID, nil)); err != nil {
		t.Errorf("no token: %v", err)
	}
}

func fileOwner(fi os.FileInfo) [2]uint32 {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return [2]uint32{}
	}
	return [2]uint32{st.Uid, st.Gid}
}
