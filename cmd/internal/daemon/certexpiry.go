package daemon

import (
	"time"

	"github.com/konnect-dev/konnect/pki"
	"github.com/prometheus/client_golang/prometheus"
)

// certExpiry is a collector that reads a certificate from disk on each scrape, so that it follows hot
// reloads and renewals without any wiring.
type certExpiry struct {
	desc *prometheus.Desc
	file string
}

// RegisterCertExpiry exports konnect_certificate_expiry_seconds{name,file} for certFile. An empty certFile
// registers nothing. It may be called once per certificate on the same registry: name and file are constant
// labels, so each certificate is a collector of its own.
func RegisterCertExpiry(reg prometheus.Registerer, name, certFile string) error {
	if certFile == "" {
		return nil
	}
	desc := prometheus.NewDesc("konnect_certificate_expiry_seconds",
		"Seconds until the certificate expires (negative once expired). Absent when the file cannot be read.",
		nil, prometheus.Labels{"name": name, "file": certFile})
	return reg.Register(&certExpiry{desc: desc, file: certFile})
}

func (c *certExpiry) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *certExpiry) Collect(ch chan<- prometheus.Metric) {
	notAfter, err := CertNotAfter(c.file)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, time.Until(notAfter).Seconds())
}

// CertNotAfter returns the NotAfter of the first certificate in a PEM file.
func CertNotAfter(file string) (time.Time, error) {
	cert, err := pki.ReadCertificate(file)
	if err != nil {
		return time.Time{}, err
	}
	return cert.NotAfter, nil
}
