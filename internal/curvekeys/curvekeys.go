// Package curvekeys makes the CURVE key pairs of a pipeline's data connections: X25519 keys in
// ZeroMQ's Z85 text form (RFC 32), exactly what the agent's security.curve key files hold.
package curvekeys

import (
	"crypto/ecdh"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
)

// KeyPair is a CURVE key pair, each key 40 Z85 characters.
type KeyPair struct {
	Public, Secret string
}

// New draws a key pair from crypto/rand.
func New() (KeyPair, error) { return newFrom(rand.Reader) }

func newFrom(r io.Reader) (KeyPair, error) {
	priv, err := ecdh.X25519().GenerateKey(r)
	if err != nil {
		return KeyPair{}, err
	}
	pub, err := Encode(priv.PublicKey().Bytes())
	if err != nil {
		return KeyPair{}, err
	}
	sec, err := Encode(priv.Bytes())
	if err != nil {
		return KeyPair{}, err
	}
	return KeyPair{Public: pub, Secret: sec}, nil
}

// PublicOf returns the public key of a Z85 secret key.
func PublicOf(secret string) (string, error) {
	raw, err := Decode(secret)
	if err != nil {
		return "", err
	}
	priv, err := ecdh.X25519().NewPrivateKey(raw)
	if err != nil {
		return "", err
	}
	return Encode(priv.PublicKey().Bytes())
}

const alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"

// Encode is Z85: every 4 bytes become 5 characters; the length must be a multiple of 4.
func Encode(b []byte) (string, error) {
	if len(b)%4 != 0 {
		return "", fmt.Errorf("z85: %d bytes is not a multiple of 4", len(b))
	}
	out := make([]byte, 0, len(b)*5/4)
	for ; len(b) >= 4; b = b[4:] {
		v := binary.BigEndian.Uint32(b)
		var chunk [5]byte
		for j := 4; j >= 0; j-- {
			chunk[j] = alphabet[v%85]
			v /= 85
		}
		out = append(out, chunk[:]...)
	}
	return string(out), nil
}

// Decode reverses Encode.
func Decode(s string) ([]byte, error) {
	if len(s)%5 != 0 {
		return nil, fmt.Errorf("z85: %d characters is not a multiple of 5", len(s))
	}
	out := make([]byte, 0, len(s)*4/5)
	for i := 0; i < len(s); i += 5 {
		var v uint64
		for j := 0; j < 5; j++ {
			d := indexOf(s[i+j])
			if d < 0 {
				return nil, fmt.Errorf("z85: %q is not a Z85 character", s[i+j])
			}
			v = v*85 + uint64(d)
		}
		if v > 0xffffffff {
			return nil, fmt.Errorf("z85: group %q overflows", s[i:i+5])
		}
		out = append(out, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	return out, nil
}

func indexOf(c byte) int {
	for i := 0; i < len(alphabet); i++ {
		if alphabet[i] == c {
			return i
		}
	}
	return -1
}
