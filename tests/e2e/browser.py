"""A real headless browser for the dashboard's tests: Debian's chromium through Selenium and
chromedriver (``make test`` installs both), and the moves every such test makes."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.wait import WebDriverWait


@contextlib.contextmanager
def open_browser() -> Iterator[WebDriver]:
    """A headless chromium session, quit on exit."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "make test installs Debian's chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(flag)
    session = webdriver.Chrome(service=Service(driver), options=options)
    session.set_page_load_timeout(30)
    try:
        yield session
    finally:
        session.quit()


def follow(browser: WebDriver, element: WebElement) -> None:
    """Click ``element`` and wait until the page it leads to has replaced this one (a find right
    after a click may otherwise get the old page's element, stale a moment later)."""
    old = browser.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(browser, 30).until(lambda _: _gone(old))
    WebDriverWait(browser, 30).until(lambda b: b.execute_script("return document.readyState") == "complete")


def _gone(element: WebElement) -> bool:
    """Whether ``element`` has left the document. Selenium's ``staleness_of`` knows only the stale
    error; chromedriver asked mid-navigation may answer "Node with given id does not belong to the
    document" instead (an unknown error, seen in CI), which says the same."""
    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as error:
        if "does not belong to the document" in str(error):
            return True
        raise
    return False


def sign_in(browser: WebDriver, base_url: str, api_key: str) -> None:
    """Sign in to the dashboard at ``base_url`` with ``api_key``."""
    browser.get(f"{base_url}/dashboard/login")
    browser.find_element(By.NAME, "api_key").send_keys(api_key)
    follow(browser, browser.find_element(By.CSS_SELECTOR, "form button"))


def table(browser: WebDriver, css: str, key: str) -> dict[str, list[str]]:
    """The rows of table ``css`` that have attribute ``key``, by its value: their cells' texts."""
    return {
        str(row.get_attribute(key)): [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        for row in browser.find_elements(By.CSS_SELECTOR, f"{css} tr[{key}]")
    }
