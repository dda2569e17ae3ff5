package curvekeys

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/numastream/numastream/internal/testenv"
)

func TestZ85MatchesTheSpecification(t *testing.T) {
	// RFC 32's test vector.
	raw := []byte{0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B}
	got, err := Encode(raw)
	if err != nil || got != "HelloWorld" {
		t.Fatalf("Encode = %q, %v; want HelloWorld", got, err)
	}
	back, err := Decode(got)
	if err != nil || !bytes.Equal(back, raw) {
		t.Fatalf("Decode = %x, %v", back, err)
	}
	for _, bad := range []string{"Hell", "Hell~World", "%%%%%"} { // length, alphabet, overflow
		if _, err := Decode(bad); err == nil {
			t.Errorf("Decode(%q) accepted", bad)
		}
	}
	if _, err := Encode([]byte{1, 2, 3}); err == nil {
		t.Error("Encode of 3 bytes accepted")
	}
}

func TestKeyPairsAreDistinctAndConsistent(t *testing.T) {
	a, err := New()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := New()
	if len(a.Public) != 40 || len(a.Secret) != 40 || a.Public == b.Public || a.Secret == b.Secret {
		t.Fatalf("keys %+v %+v", a, b)
	}
	pub, err := PublicOf(a.Secret)
	if err != nil || pub != a.Public {
		t.Fatalf("PublicOf = %q, %v; want %q", pub, err, a.Public)
	}
}

// Keys made here are the keys the agent uses: a real sender and receiver stream over CURVE with
// them, and a sender with another key is refused.
func TestOperatorKeysWorkWithTheAgent(t *testing.T) {
	agent := testenv.Agent(t)
	dir := t.TempDir()
	gw, _ := New()
	tx, _ := New()
	other, _ := New()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gwSecret, gwPublic := write("gw.secret", gw.Secret), write("gw.public", gw.Public)
	allowed := write("allowed", tx.Public)
	port := "tcp://127.0.0.1:" + testenv.FreePort(t)
	rx := exec.Command(agent, "receive", "--endpoint", port, "--chunk-bytes", "65536", "--idle-timeout", "20",
		"--set", "security.curve.secret_key_file="+gwSecret, "--set", "security.curve.allowed_keys_file="+allowed)
	var rxOut bytes.Buffer
	rx.Stdout = &rxOut
	if err := rx.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rx.Process.Kill() }()
	send := func(secret string, stream string) ([]byte, error) {
		return exec.Command(agent, "send", "--endpoint", port, "--chunk-bytes", "65536", "--chunks", "10",
			"--set", "stream_id="+stream, "--set", "security.curve.secret_key_file="+write(stream+".secret", secret),
			"--set", "security.curve.server_key_file="+gwPublic).CombinedOutput()
	}
	if out, err := send(other.Secret, "7"); err == nil || !strings.Contains(string(out), "refused this sender's key") {
		t.Errorf("a sender with another key: %v\n%s", err, out)
	}
	if out, err := send(tx.Secret, "0"); err != nil {
		t.Fatalf("the pipeline's sender: %v\n%s", err, out)
	}
	if err := rx.Wait(); err != nil {
		t.Fatalf("receiver: %v\n%s", err, rxOut.String())
	}
	if !strings.Contains(rxOut.String(), `"curve":true`) || !strings.Contains(rxOut.String(), `"chunks":10`) {
		t.Errorf("receiver summary %s", rxOut.String())
	}
}
