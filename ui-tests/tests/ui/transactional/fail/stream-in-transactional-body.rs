use workflow_core::prelude::*;

#[step(transactional)]
async fn debit(tx: &mut Tx<'_>, cents: i64) -> Result<i64> {
    stream::<i64>("progress").write(cents).await?;
    tx.sqlite(move |_| Ok(cents))
}

fn main() {}
