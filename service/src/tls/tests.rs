use super::*;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

async fn health(address: &str) -> Result<(), String> {
    let ch = channel(address, |e| e.connect_timeout(Duration::from_secs(5)))
        .await
        .map_err(|e| e.to_string())?;
    let mut c = tonic_health::pb::health_client::HealthClient::new(ch);
    c.check(tonic_health::pb::HealthCheckRequest { service: String::new() })
        .await
        .map(|_| ())
        .map_err(|s| s.to_string())
}

#[tokio::test]
async fn mutual_tls_lets_in_only_certificates_of_the_ca_and_picks_up_a_new_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::new("test CA").unwrap();
    let files = ca.write_local(dir.path()).unwrap();
    let server = Arc::new(
        ServerTls::new(&files.cert, &files.key, Some(&files.ca), ClientAuth::Required).unwrap(),
    );
    let (_reporter, health_service) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("https://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let router = tonic::transport::Server::builder().add_service(health_service);
    tokio::spawn(serve(router, listener, Some(Arc::clone(&server)), std::future::pending()));

    // The one process-wide client set-up, changed between the cases.
    install_client(Some(ClientTls::new(&files.ca, Some((&files.cert, &files.key)), None).unwrap()));
    health(&address).await.unwrap();

    install_client(Some(ClientTls::new(&files.ca, None, None).unwrap()));
    let err = health(&address).await.unwrap_err();
    assert!(err.contains("CertificateRequired"), "{err}");

    let other = Authority::new("another CA").unwrap();
    let (c, k) = other.issue(&["localhost"], Validity::Current).unwrap();
    let (oc, ok) = (write(dir.path(), "other.pem", &c), write(dir.path(), "other-key.pem", &k));
    install_client(Some(ClientTls::new(&files.ca, Some((&oc, &ok)), None).unwrap()));
    let err = health(&address).await.unwrap_err();
    assert!(err.contains("UnknownCA"), "{err}");

    let (c, k) = ca.issue(&["localhost"], Validity::Expired).unwrap();
    let (ec, ek) = (write(dir.path(), "expired.pem", &c), write(dir.path(), "expired-key.pem", &k));
    install_client(Some(ClientTls::new(&files.ca, Some((&ec, &ek)), None).unwrap()));
    let err = health(&address).await.unwrap_err();
    assert!(err.contains("CertificateExpired"), "{err}");

    // A server certificate for another name fails the client's check unless the name is given.
    install_client(Some(ClientTls::new(&files.ca, Some((&files.cert, &files.key)), None).unwrap()));
    let (c, k) = ca.issue(&["coordinator.comas"], Validity::Current).unwrap();
    std::fs::write(&files.key, k).unwrap();
    std::fs::write(&files.cert, c).unwrap();
    let err = health(&address).await.unwrap_err();
    assert!(err.contains("NotValidForName") || err.contains("not valid for name"), "{err}");
    let (c, k) = ca.issue(&["localhost"], Validity::Current).unwrap();
    let (lc, lk) = (write(dir.path(), "client.pem", &c), write(dir.path(), "client-key.pem", &k));
    install_client(Some(
        ClientTls::new(&files.ca, Some((&lc, &lk)), Some("coordinator.comas".into())).unwrap(),
    ));
    health(&address).await.unwrap();

    install_client(None);
    let err = health(&address).await.unwrap_err();
    assert!(err.contains("no TLS set up"), "{err}");
}

#[test]
fn a_service_needs_all_three_files_and_says_which_is_missing() {
    let a = TlsArgs { cert: Some("c.pem".into()), ..TlsArgs::default() };
    assert!(a.service().err().unwrap().to_string().contains("--tls-key"));
    let a = TlsArgs { ca: Some("ca.pem".into()), ..TlsArgs::default() };
    assert!(a.service().err().unwrap().to_string().contains("without --tls-cert"));
    let a = TlsArgs {
        cert: Some("/nonexistent/c.pem".into()),
        key: Some("k.pem".into()),
        ca: Some("/nonexistent/ca.pem".into()),
        ..TlsArgs::default()
    };
    assert!(a.service().err().unwrap().to_string().contains("/nonexistent/ca.pem: No such file"));
    let dir = tempfile::tempdir().unwrap();
    let junk = write(dir.path(), "junk.pem", "hello");
    let a = TlsArgs {
        cert: Some(junk.clone()),
        key: Some(junk.clone()),
        ca: Some(junk),
        ..TlsArgs::default()
    };
    assert!(a.service().err().unwrap().to_string().contains("no PEM certificate"));
}
