//! TLS for the API: a certificate chain and key (PEM files) loaded into a rustls server configuration, and the private
//! certificate authority that `gpunet up` keeps in its data directory (a CA that lives as long as the directory, and a
//! server certificate for this machine's names made again at every start). Private keys are written with mode 0600.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Errors of loading or making certificates.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("use {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file does not hold what it should.
    #[error("parse {path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// rustls refused the certificate and key.
    #[error("use the certificate {cert} with the key {key}: {reason}")]
    Config {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        reason: String,
    },
    /// A certificate could not be made.
    #[error("generate the {what}: {reason}")]
    Generate {
        /// Which.
        what: &'static str,
        /// Why.
        reason: String,
    },
}

/// A server certificate chain and its private key, as PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain (leaf first).
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// The rustls configuration serving `files` (HTTP/1.1, TLS 1.2 and 1.3, no client certificates).
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let parse =
        |path: &Path, e: rustls::pki_types::pem::Error| TlsError::Parse { path: path.into(), reason: e.to_string() };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| parse(&files.cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| parse(&files.cert, e))?;
    if certs.is_empty() {
        return Err(TlsError::Parse { path: files.cert.clone(), reason: "no PEM certificate in the file".into() });
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| parse(&files.key, e))?;
    let fail =
        |e: rustls::Error| TlsError::Config { cert: files.cert.clone(), key: files.key.clone(), reason: e.to_string() };
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(fail)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(fail)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// `gpunet up`'s certificates, under `DIR/tls`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalCa {
    /// The CA certificate that clients and agents trust (`--ca`, `GPUNET_CA`).
    pub ca_cert: PathBuf,
    /// The server's certificate and key, signed by the CA.
    pub server: TlsFiles,
}

/// Writes `data` to `path`, readable by its owner only when `secret`.
fn write_file(path: &Path, data: &str, secret: bool) -> Result<(), TlsError> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let io = |source| TlsError::Io { path: path.into(), source };
    let mode = if secret { 0o600 } else { 0o644 };
    let mut f =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(path).map_err(io)?;
    // An existing file keeps its mode on open: set it.
    f.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(io)?;
    f.write_all(data.as_bytes()).and_then(|_| f.sync_all()).map_err(io)
}

/// The CA's parameters: the same at every start, so that a stored CA key signs certificates that chain to the stored
/// CA certificate.
fn ca_params(year: i32) -> rcgen::CertificateParams {
    let mut p = rcgen::CertificateParams::default();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(rcgen::DnType::CommonName, "gpunet local CA");
    p.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    p.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
    p.not_after = rcgen::date_time_ymd(year + 20, 1, 1);
    p
}

fn this_year() -> i32 {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    1970 + (secs / 31_556_952) as i32
}

/// Makes (or reuses) the private CA in `DIR/tls` and a fresh server certificate for `names` (DNS names or IP
/// addresses; names that are neither are skipped). Key files are 0600, the directory 0700.
pub fn local_ca(dir: &Path, names: &[String]) -> Result<LocalCa, TlsError> {
    use std::os::unix::fs::PermissionsExt;
    let tls = dir.join("tls");
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TlsError::Io { path, source }
    };
    std::fs::create_dir_all(&tls).map_err(io(&tls))?;
    std::fs::set_permissions(&tls, std::fs::Permissions::from_mode(0o700)).map_err(io(&tls))?;
    let gen = |what: &'static str| move |e: rcgen::Error| TlsError::Generate { what, reason: e.to_string() };
    let (ca_cert, ca_key) = (tls.join("ca.pem"), tls.join("ca.key"));
    let year = this_year();
    let key = match (std::fs::read_to_string(&ca_key), ca_cert.exists()) {
        (Ok(pem), true) => rcgen::KeyPair::from_pem(&pem)
            .map_err(|e| TlsError::Parse { path: ca_key.clone(), reason: e.to_string() })?,
        _ => {
            let key = rcgen::KeyPair::generate().map_err(gen("CA key"))?;
            let cert = ca_params(year).self_signed(&key).map_err(gen("CA certificate"))?;
            write_file(&ca_key, &key.serialize_pem(), true)?;
            write_file(&ca_cert, &cert.pem(), false)?;
            key
        }
    };
    // The stored CA certificate was made in some earlier year; the issuer needs only its name and key.
    let issuer = rcgen::Issuer::new(ca_params(year), key);
    let mut sans = Vec::new();
    for n in names {
        let dns = n.len() <= 253 && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
        let ok = n.parse::<std::net::IpAddr>().is_ok() || dns;
        if ok && !n.is_empty() && !sans.contains(n) {
            sans.push(n.clone());
        }
    }
    let mut p = rcgen::CertificateParams::new(sans).map_err(gen("server certificate"))?;
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(rcgen::DnType::CommonName, "gpunet server");
    p.use_authority_key_identifier_extension = true;
    p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    p.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
    p.not_after = rcgen::date_time_ymd(year + 2, 1, 1);
    let server_key = rcgen::KeyPair::generate().map_err(gen("server key"))?;
    let cert = p.signed_by(&server_key, &issuer).map_err(gen("server certificate"))?;
    let server = TlsFiles { cert: tls.join("server.pem"), key: tls.join("server.key") };
    write_file(&server.key, &server_key.serialize_pem(), true)?;
    write_file(&server.cert, &cert.pem(), false)?;
    Ok(LocalCa { ca_cert, server })
}

/// The names a certificate for a server listening on `listen` should carry: `localhost`, the loopback addresses, the
/// listen address when it is a specific one, and the host name.
pub fn local_names(listen: std::net::SocketAddr) -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    if !listen.ip().is_unspecified() {
        names.push(listen.ip().to_string());
    }
    if let Ok(h) = std::fs::read_to_string("/etc/hostname") {
        names.push(h.trim().to_string());
    }
    names
}
