//! STUB — replaced by the real demo module.
pub async fn run_stdio() -> anyhow::Result<()> { Ok(()) }
pub async fn run_http(_addr: std::net::SocketAddr) -> anyhow::Result<()> { Ok(()) }
