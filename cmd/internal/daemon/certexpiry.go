package daemon

import (
	"time"

	"github.com/konnect-dev/konnect/pki/reload"
	"github.com/prometheus/client_golang/prometheus"
)

// certExpiry is a collector of one certificate the daemon uses. It reports the certificate in use, not the
// file: after a renewal that does not load (a certificate without its new key), the daemon keeps serving the
// old certificate, and an expiry alert must still see it expire.
type certExpiry struct {
	expiry, pending *prometheus.Desc
	cert            reload.Cert
}

// RegisterCertExpiry exports, for a certificate the daemon loaded through pki/reload,
// konnect_certificate_expiry_seconds{name,file} (seconds until the certificate in use expires) and
// konnect_certificate_reload_pending{name,file} (1 while the file on disk is not that certificate because it
// changed and does not load, or is gone). It may be called once per certificate on the same registry: name
// and file are constant labels, so each certificate is a collector of its own.
func RegisterCertExpiry(reg prometheus.Registerer, name string, cert reload.Cert) error {
	labels := prometheus.Labels{"name": name, "file": cert.File}
	return reg.Register(&certExpiry{
		expiry: prometheus.NewDesc("konnect_certificate_expiry_seconds",
			"Seconds until the certificate in use expires (negative once expired): a CA bundle's first certificate.",
			nil, labels),
		pending: prometheus.NewDesc("konnect_certificate_reload_pending",
			"1 while the certificate file on disk is not the one in use: it changed and does not load (such as a "+
				"certificate without its new key), or it cannot be read. The log says why.",
			nil, labels),
		cert: cert,
	})
}

func (c *certExpiry) Describe(ch chan<- *prometheus.Desc) { ch <- c.expiry; ch <- c.pending }

func (c *certExpiry) Collect(ch chan<- prometheus.Metric) {
	inUse, err := c.cert.InUse()
	pending := 0.0
	if err != nil {
		pending = 1
	}
	ch <- prometheus.MustNewConstMetric(c.expiry, prometheus.GaugeValue, time.Until(inUse.NotAfter).Seconds())
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, pending)
}
