//! `LossyProxy` over real loopback sockets: what each loss does to the client's side and
//! to the server's.

use std::io::ErrorKind;

use palisade_testkit::{Loss, LossyProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Sends `request` through the proxy; returns the client's stream and the server's
/// side of the connection, with the request read from it.
async fn connect(
    proxy: &LossyProxy,
    server: &TcpListener,
    request: &[u8],
) -> (TcpStream, TcpStream) {
    let mut client = TcpStream::connect(proxy.addr())
        .await
        .expect("connect to the proxy");
    client.write_all(request).await.expect("send the request");
    let (mut upstream, _) = server.accept().await.expect("the proxy connects upstream");
    let mut got = vec![0u8; request.len()];
    upstream
        .read_exact(&mut got)
        .await
        .expect("the request reaches the server");
    assert_eq!(got, request);
    (client, upstream)
}

#[tokio::test]
async fn reset_client_resets_the_client_and_leaves_the_server_working() {
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = LossyProxy::start(server.local_addr().unwrap()).await;
    proxy.set(Loss::ResetClient);
    let (mut client, mut upstream) = connect(&proxy, &server, b"POST /acquire").await;

    // The client's connection is reset (RST, not an orderly end), with no answer.
    let mut buf = [0u8; 64];
    let err = client
        .read(&mut buf)
        .await
        .expect_err("the client's connection is reset");
    assert_eq!(err.kind(), ErrorKind::ConnectionReset);
    assert_eq!(proxy.loss(), Loss::None, "the reset happens once");

    // The server's side stays open after the client's reset: no end of stream is
    // waiting for it, its answer is taken, and only its own close ends the connection.
    let pending = upstream.try_read(&mut buf);
    assert!(
        matches!(&pending, Err(e) if e.kind() == ErrorKind::WouldBlock),
        "the server's side was closed with the client's: {pending:?}"
    );
    upstream
        .write_all(b"200 granted")
        .await
        .expect("the server answers");
    upstream.shutdown().await.unwrap();
    assert_eq!(upstream.read(&mut buf).await.unwrap(), 0);

    // The next connection passes both ways.
    let (mut client, mut upstream) = connect(&proxy, &server, b"POST /acquire").await;
    upstream.write_all(b"200").await.unwrap();
    let mut answer = [0u8; 3];
    client.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"200");
}

#[tokio::test]
async fn next_answer_closes_both_sides_once_the_server_answered() {
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = LossyProxy::start(server.local_addr().unwrap()).await;
    proxy.set(Loss::NextAnswer);
    let (mut client, mut upstream) = connect(&proxy, &server, b"POST /release").await;
    upstream.write_all(b"200").await.unwrap();
    let mut buf = [0u8; 64];
    // Dropped and closed: the client reads the end of the stream, no answer.
    assert_eq!(client.read(&mut buf).await.unwrap(), 0);
    assert_eq!(upstream.read(&mut buf).await.unwrap(), 0);
    assert_eq!(proxy.loss(), Loss::None);
}
