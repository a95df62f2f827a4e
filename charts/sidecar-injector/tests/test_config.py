"""The ConfigMap: config.yaml as docs/CONTRACT.md describes it, and the templates beside it."""

import re
from pathlib import Path

import yaml

from chart import ROOT, bundled_templates, contract, render, render_error


def test_config_keys_match_the_contract(helm):
    config = render(helm=helm).config
    documented = contract()["config"]
    assert set(config) == set(documented)
    assert set(config["skip"]) == set(documented["skip"])
    assert set(config["validation"]) == set(documented["validation"])
    assert config["templatesDir"] == "."


def test_config_follows_the_values(helm):
    r = render("config.validation.mode=warn", "config.skip.windows=false",
               "config.values.proxy.port=9999", "config.defaultTemplates={proxy}", helm=helm)
    assert r.config["validation"] == {"mode": "warn"}
    assert r.config["skip"]["windows"] is False
    assert r.config["values"]["proxy"]["port"] == 9999
    assert r.config["defaultTemplates"] == ["proxy"]


def test_chart_defaults_are_the_binarys_defaults():
    # templates/config.yaml is the configuration compiled into the binary: a chart install
    # with default values must behave like the binary without a config file.
    embedded = yaml.safe_load((ROOT / "templates" / "config.yaml").read_text())
    config = render().config
    for key, value in embedded.items():
        assert config[key] == value, key


def test_templates_are_the_repositorys(helm):
    data = render(helm=helm).one("ConfigMap")["data"]
    templates = bundled_templates()
    assert templates, "no templates/*.yaml.j2 in the repository"
    assert {k: v for k, v in data.items() if k != "config.yaml"} == templates
    assert "config.yaml" not in templates  # the binary's own config stays out


def test_every_default_template_exists(helm):
    data = render(helm=helm).one("ConfigMap")["data"]
    for name in render(helm=helm).config["defaultTemplates"]:
        assert f"{name}.yaml.j2" in data


def test_extra_templates_add_and_replace(helm):
    r = render(values={"extraTemplates": {"extra": "containers: []\n", "proxy": "containers: []\n"}},
               helm=helm)
    data = r.one("ConfigMap")["data"]
    assert data["extra.yaml.j2"] == "containers: []\n"
    assert data["proxy.yaml.j2"] == "containers: []\n"
    assert data["log-shipper.yaml.j2"] == bundled_templates()["log-shipper.yaml.j2"]


def test_unknown_default_template_is_refused(helm):
    message = render_error("config.defaultTemplates={nope}", helm=helm)
    assert '"nope"' in message and "extraTemplates" in message


def test_unknown_default_template_lists_the_known_names(helm):
    message = render_error("config.defaultTemplates={nope}", values={"extraTemplates": {"auditor": "containers: []\n"}},
                           helm=helm)
    assert "(known: auditor, log-shipper, proxy)" in message, message


def test_a_template_key_with_its_file_suffix_is_refused_saying_so(helm):
    message = render_error("config.defaultTemplates={auditor}",
                           values={"extraTemplates": {"auditor.yaml.j2": "containers: []\n"}}, helm=helm)
    assert 'extraTemplates key "auditor.yaml.j2"' in message and '"auditor"' in message, message
    assert "there is no such template" not in message, message


def test_bad_template_name_is_refused(helm):
    assert "schema" in render_error(values={"extraTemplates": {"a/b": "x"}}, helm=helm)


def test_configmap_keys_are_valid():
    for key in render(values={"extraTemplates": {"x_y.z": "a: 1"}}).one("ConfigMap")["data"]:
        assert re.fullmatch(r"[-._a-zA-Z0-9]+", key), key
